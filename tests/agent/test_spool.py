"""The on-disk spool: survives restarts, bounded, samples dropped before events; seq monotonic."""

from __future__ import annotations

from pathlib import Path

import msgspec

from sentinel.agent.spool import SEQ_BLOCK, SeqAllocator, Spool
from sentinel.components.xid.parse import xid_record
from sentinel.wire import Batch, GpuSample, XidOccurred


def _batch(seq: int, samples: int = 4, events: int = 1) -> Batch:
    return Batch(
        seq=seq,
        t=float(seq),
        samples=[GpuSample(gpu=i, t=float(seq), temp_c=50.0, mem_used_bytes=1 << 30) for i in range(samples)],
        events=[
            XidOccurred(t=float(seq), text="x" * 50, record=xid_record(79, "x" * 50)) for _ in range(events)
        ],
    )


def test_persists_and_acks(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for seq in range(5):
        spool.add(_batch(seq))
    assert spool.ack(1) and not spool.ack(1)
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.seqs() == [0, 2, 3, 4]
    data = reopened.read(3)
    assert data is not None
    assert msgspec.msgpack.decode(data, type=Batch) == _batch(3)


def test_bound_drops_samples_oldest_first_then_events(tmp_path: Path) -> None:
    one = len(msgspec.msgpack.encode(_batch(0)))
    spool = Spool(tmp_path, max_bytes=one * 6)
    for seq in range(10):
        spool.add(_batch(seq))
    assert spool.size_bytes <= spool.max_bytes
    assert spool.seqs() == list(range(10))  # every batch is still there: only samples went
    kept = [msgspec.msgpack.decode(spool.read(s) or b"", type=Batch) for s in spool.seqs()]
    stripped = [b.seq for b in kept if not b.samples]
    assert stripped == list(range(len(stripped))) and stripped  # oldest first
    assert all(len(b.events) == 1 for b in kept)
    drops = spool.take_drops()
    assert drops.samples == 4 * len(stripped) and drops.events == 0
    assert spool.take_drops().samples == 0  # reported once
    tiny = Spool(tmp_path / "tiny", max_bytes=200)
    for seq in range(10):
        tiny.add(_batch(seq, samples=0, events=3))
    assert tiny.size_bytes <= 200
    assert tiny.seqs() == list(range(10 - len(tiny.seqs()), 10))  # events go last, oldest first
    assert tiny.take_drops().events == 3 * (10 - len(tiny.seqs()))


def test_reads_what_is_on_disk_also_for_the_newest_batch(tmp_path: Path) -> None:
    """The newest batch is read as written, also when the bound stripped it right away (its samples went)."""
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.add(_batch(0))
    assert spool.read(0) == next(tmp_path.glob("*.batch")).read_bytes()
    assert spool.ack(0) and spool.read(0) is None
    events_only = len(msgspec.msgpack.encode(_batch(0, samples=0)))
    small = Spool(tmp_path / "small", max_bytes=events_only + 10)
    small.add(_batch(1))
    data = small.read(1)
    assert data is not None and data == next((tmp_path / "small").glob("*.batch")).read_bytes()
    assert msgspec.msgpack.decode(data, type=Batch) == _batch(1, samples=0)


def test_seq_is_monotonic_across_restarts(tmp_path: Path) -> None:
    first = SeqAllocator(tmp_path / "seq")
    used = [first.allocate() for _ in range(5)]
    second = SeqAllocator(tmp_path / "seq")
    after = second.allocate()
    assert used == [0, 1, 2, 3, 4] and after > used[-1]
    assert after == SEQ_BLOCK
    assert SeqAllocator(tmp_path / "other", floor=77).allocate() == 77


def test_each_aggregator_has_its_own_acks_and_a_batch_leaves_once_all_have_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    for seq in range(4):
        spool.add(_batch(seq))
    assert spool.ack(0, "ws://a") and spool.ack(1, "ws://a") and not spool.ack(1, "ws://a")
    assert spool.seqs("ws://a") == [2, 3] and spool.seqs("ws://b") == [0, 1, 2, 3]
    assert spool.seqs_after(0, "ws://a") == [2, 3] and spool.seqs_after(0, "ws://b") == [1, 2, 3]
    assert len(spool) == 4  # B has none of them yet: all stay on disk
    assert spool.ack(0, "ws://b")
    assert spool.seqs() == [1, 2, 3] and not (tmp_path / f"{0:020d}_4_1.batch").exists()
    # after an agent restart each aggregator's acks are still there: A is not sent 1 again, B is
    reopened = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    assert reopened.seqs("ws://a") == [2, 3] and reopened.seqs("ws://b") == [1, 2, 3]
    assert reopened.ack(1, "ws://b") and reopened.seqs() == [2, 3]  # acked by both now: gone
    assert not reopened.ack(1, "ws://a")


def test_a_torn_ack_line_is_not_taken_for_an_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    for seq in [12, *range(120, 126)]:
        spool.add(_batch(seq))
    spool.ack(120, "ws://a")
    (log_a,) = [p for p in tmp_path.glob("acks-*.log") if p.read_text().startswith("ws://a\n")]
    with log_a.open("a") as f:
        f.write("12")  # the agent died while appending the ack of 124, after two digits
    reopened = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    assert reopened.seqs("ws://a") == [12, 121, 122, 123, 124, 125]  # the torn line is no ack of 12
    assert reopened.seqs("ws://b") == [12, *range(120, 126)]


def test_an_ack_log_is_compacted_and_stale_logs_go(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    for seq in range(3000):
        spool.add(_batch(seq, samples=0))
        spool.ack(seq, "ws://a")
        if seq >= 10:
            spool.ack(seq - 10, "ws://b")  # B trails by 10: A's log would hold 3,000 lines without compaction
    logs = {p.read_text().split("\n", 1)[0]: p for p in tmp_path.glob("acks-*.log")}
    assert len(logs["ws://a"].read_text().splitlines()) <= 1 + 2 * 10 + 1024
    assert Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b")).seqs("ws://a") == []
    single = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a",))  # back to one aggregator
    assert not list(tmp_path.glob("acks-*.log")) and single.seqs() == list(range(2990, 3000))


def test_the_byte_bound_applies_whoever_has_not_acked(tmp_path: Path) -> None:
    size = len(msgspec.msgpack.encode(_batch(0, samples=0)))
    spool = Spool(tmp_path, max_bytes=4 * size, consumers=("ws://a", "ws://b"))
    for seq in range(40):
        spool.add(_batch(seq, samples=0))
        spool.ack(seq, "ws://a")  # A keeps up; B is down
    assert spool.size_bytes <= 4 * size
    assert spool.seqs("ws://a") == [] and spool.seqs("ws://b") == spool.seqs()
    assert spool.dropped_events > 0  # the oldest were dropped for B, and counted


def test_an_ack_log_that_cannot_be_written_is_counted_and_costs_only_a_resend(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    for seq in range(3):
        spool.add(_batch(seq))
    for log in tmp_path.glob("acks-*.log"):  # something that is not a file stands where the logs go
        log.unlink()
        log.mkdir()
    assert spool.ack(0, "ws://a") and spool.write_errors == 1
    assert spool.seqs("ws://a") == [1, 2]  # this run still knows A has it
    for log in tmp_path.glob("acks-*.log"):
        log.rmdir()
    reopened = Spool(tmp_path, max_bytes=1 << 20, consumers=("ws://a", "ws://b"))
    assert reopened.seqs("ws://a") == [0, 1, 2]  # after a restart A is sent 0 again, nothing is lost

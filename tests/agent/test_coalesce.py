"""``stream.coalesce_ticks``: routine ticks held and sent with the next batch, seqs contiguous, bounded frames.

The outbox is fed tick findings on a virtual clock and spools into a real spool in tmp_path; the agent tests
run the real agent's ticks over the fake GPU source and kernel log with the stream's spool, never connected.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.agent.agent import Agent
from sentinel.agent.batch import MAX_BATCH_BYTES, TickFindings, build_batch, fit_frame
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.nvml import NvmlSource
from sentinel.agent.outbox import Outbox, routine
from sentinel.agent.ring import RingBuffer
from sentinel.agent.spool import SeqAllocator, Spool
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.fr.heads import FrHeads
from sentinel.wire import (
    MAX_BATCH_ITEMS,
    Batch,
    ClockViolations,
    Drops,
    EccCounters,
    GpuSample,
    GpuStateChanged,
    ProcInfo,
    SampleEntry,
    XidOccurred,
    decode_agent_frame,
)
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.agent.fakes import FakeHost, FakeSource

KINDS = ("routine", "event", "heads", "procs", "slow", "violations", "lost", "drops")


def _outbox(tmp_path: Path, coalesce: int, held_max_bytes: int | None = None) -> Outbox:
    ring = RingBuffer("host-test", 900.0, 64 << 20)
    spool = Spool(tmp_path / "spool", 1 << 30)
    extra = {} if held_max_bytes is None else {"held_max_bytes": held_max_bytes}
    return Outbox(ring, SeqAllocator(None), spool, AgentCounters(), coalesce_ticks=coalesce, **extra)


def _findings(t: float, kind: str = "routine", gpus: int = 8) -> TickFindings:
    samples = [
        GpuSample(gpu=i, t=t, util_gpu_pct=90.0 + i, temp_c=60.0, power_w=500.0, pids=[100 + i])
        for i in range(gpus)
    ]
    tick = TickFindings(samples=samples)
    if kind == "event":
        tick.events.append(
            GpuStateChanged(t=t, gpu=1, severity="critical", state="unresponsive", previous="ok")
        )
    elif kind == "heads":
        tick.heads.append(FrHeads(rank=0, t=t, job_id="7"))
    elif kind == "procs":
        tick.procs = [ProcInfo(gpu=0, pid=100, job_id="7", rank=0)]
    elif kind == "slow":
        samples[0].ecc = EccCounters(volatile_corrected=0, volatile_uncorrected=0)
    elif kind == "violations":
        samples[2].violations = ClockViolations(reference_us=int(t * 1e6))
    elif kind == "lost":
        samples[3].state = "lost"
    return tick


def _tick(
    box: Outbox, t: float, kind: str = "routine", *, final: bool = False, gpus: int = 8
) -> Batch | None:
    if kind == "drops":
        box.counters.drop_parts["log_lines_cut"] += 1
    tick = _findings(t, kind, gpus)
    batch = box.build(tick, tick.heads, t)
    return box.keep(batch, tick.heads, t, final=final)


def _spooled(box: Outbox) -> list[Batch]:
    assert box.spool is not None
    out = []
    for seq in box.spool.seqs():
        data = box.spool.read(seq)
        assert data is not None
        frame = decode_agent_frame(data)
        assert isinstance(frame, Batch)
        out.append(frame)
    return out


def _ring_samples(box: Outbox, now: float) -> list[tuple[float, int]]:
    """(t, gpu) of every sample the ring buffer holds, oldest first."""
    entries = box.ring.snapshot(now).entries
    return [(e.data.t, e.data.gpu) for e in entries if isinstance(e, SampleEntry)]


def _ticks_in(batch: Batch) -> list[float]:
    return sorted({s.t for s in batch.samples})


def test_routine_is_fast_samples_of_ok_gpus_and_nothing_else() -> None:
    def batch(kind: str) -> Batch:
        tick = _findings(5.0, kind)
        return build_batch(
            tick, tick.heads, seq=0, now=5.0, drops=Drops(log_lines=1) if kind == "drops" else None
        )

    assert routine(batch("routine"))
    assert routine(Batch(seq=0, t=1.0))  # a tick with no GPU at all has nothing to say either
    for kind in KINDS[1:]:
        assert not routine(batch(kind)), kind
    readings: dict[str, object] = {
        "ports": [],
        "netdevs": [],
        "ras": [RasStatus(t=5.0)],
        "fabric_manager": FabricManagerStatus(present=True, running=True),
        "gpu_source": GpuSourceHealth(ok=False),
    }
    for name, value in readings.items():
        assert not routine(msgspec.structs.replace(batch("routine"), **{name: value})), name


@pytest.mark.parametrize("coalesce", [2, 3])
def test_routine_ticks_are_held_and_go_with_the_next_batch(tmp_path: Path, coalesce: int) -> None:
    box = _outbox(tmp_path, coalesce)
    returned = [_tick(box, float(t)) for t in range(1, 3 * coalesce + 1)]
    held = [b is None for b in returned]
    assert held == ([True] * (coalesce - 1) + [False]) * 3
    batches = _spooled(box)
    assert [b.seq for b in batches] == [0, 1, 2]
    assert [_ticks_in(b) for b in batches] == [
        [float(t) for t in range(1 + i * coalesce, 1 + (i + 1) * coalesce)] for i in range(3)
    ]
    assert all(b.t == _ticks_in(b)[-1] for b in batches)  # stamped with the tick that sent it
    assert [b for b in returned if b is not None] == batches
    assert len(_ring_samples(box, 100.0)) == 3 * coalesce * 8  # the ring has every tick


@pytest.mark.parametrize("kind", KINDS[1:])
def test_a_tick_that_is_not_routine_sends_at_once_with_what_is_held(tmp_path: Path, kind: str) -> None:
    box = _outbox(tmp_path, 5)
    assert _tick(box, 1.0) is None and _tick(box, 2.0) is None
    sent = _tick(box, 3.0, kind)
    assert sent is not None and sent.seq == 0
    assert _ticks_in(sent) == [1.0, 2.0, 3.0]
    assert [s.t for s in sent.samples] == sorted(s.t for s in sent.samples)  # oldest first
    assert (sent.events != []) == (kind == "event")
    assert (sent.heads != []) == (kind == "heads")
    assert (sent.procs is not None) == (kind == "procs")
    assert (sent.drops is not None) == (kind == "drops")
    assert _tick(box, 4.0) is None  # and holding starts afresh
    assert _spooled(box) == [sent]


def test_the_final_tick_sends_what_is_held(tmp_path: Path) -> None:
    box = _outbox(tmp_path, 10)
    assert _tick(box, 1.0) is None
    assert box.held_ticks == box.counters.queue_depth["held_ticks"] == 1
    sent = _tick(box, 2.0, final=True)
    assert sent is not None and _ticks_in(sent) == [1.0, 2.0]
    assert box.held_ticks == box.counters.queue_depth["held_ticks"] == 0


def test_coalesce_one_spools_every_tick_as_before(tmp_path: Path) -> None:
    """Each frame is byte for byte what the tick's batch alone encodes to, numbered tick by tick."""
    box = _outbox(tmp_path, 1)
    kinds = ["routine", "slow", "routine", "event", "routine", "heads", "drops", "routine"]
    expected = []
    for seq, kind in enumerate(kinds):
        t = float(seq + 1)
        sent = _tick(box, t, kind)
        assert sent is not None and sent.seq == seq
        tick = _findings(t, kind)
        before = build_batch(tick, tick.heads, seq=seq, now=t, drops=sent.drops)
        expected.append(fit_frame(before).data)
    assert box.spool is not None
    assert [box.spool.read(seq) for seq in box.spool.seqs()] == expected
    assert "held_ticks" not in box.counters.queue_depth  # the agent's metrics unchanged too


def test_a_64_gpu_host_coalescing_10_ticks_stays_within_a_frame(tmp_path: Path) -> None:
    box = _outbox(tmp_path, 10)
    sent = [_tick(box, float(t), gpus=64) for t in range(1, 21)]
    batches = [b for b in sent if b is not None]
    assert len(batches) == 2 and all(len(b.samples) == 640 for b in batches)
    assert box.spool is not None
    for seq in box.spool.seqs():
        data = box.spool.read(seq)
        assert data is not None and len(data) <= MAX_BATCH_BYTES
        batch = decode_agent_frame(data)
        assert isinstance(batch, Batch) and len(batch.samples) <= MAX_BATCH_ITEMS


def test_held_samples_beyond_their_byte_bound_send_early(tmp_path: Path) -> None:
    """The held samples' bound (a quarter frame; here made small) sends the tick that would pass it."""
    one_tick = len(msgspec.msgpack.encode(_findings(1.0).samples)) - 1  # the array header is not kept
    box = _outbox(tmp_path, 10, held_max_bytes=2 * one_tick)
    returned = [_tick(box, float(t)) for t in range(1, 7)]
    assert [b is None for b in returned] == [True, True, False, True, True, False]
    assert [_ticks_in(b) for b in _spooled(box)] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


@settings(max_examples=60, deadline=None)
@given(
    coalesce=st.integers(min_value=1, max_value=10),
    kinds=st.lists(st.sampled_from(KINDS + ("routine",) * 6), min_size=1, max_size=40),
)
def test_every_sample_is_spooled_once_in_order_with_contiguous_seqs(
    tmp_path_factory: pytest.TempPathFactory, coalesce: int, kinds: list[str]
) -> None:
    box = _outbox(tmp_path_factory.mktemp("spool"), coalesce)
    for i, kind in enumerate(kinds):
        _tick(box, float(i + 1), kind, final=i == len(kinds) - 1)
    batches = _spooled(box)
    assert [b.seq for b in batches] == list(range(len(batches)))
    ring = _ring_samples(box, float(len(kinds) + 1))
    assert [(s.t, s.gpu) for b in batches for s in b.samples] == ring
    assert all(len(_ticks_in(b)) <= coalesce for b in batches)
    assert box.held_ticks == 0


def _agent(tmp_path: Path, coalesce: int, host: FakeHost, clock: list[float]) -> Agent:
    (tmp_path / "state").mkdir()
    config = make_config(
        tmp_path,
        stream={
            "enabled": True,
            "aggregator_url": "ws://127.0.0.1:9/api/v1/stream",
            "coalesce_ticks": coalesce,
        },
        collect={"tick_s": 1.0, "slow_tick_s": 3600.0, "procs_interval_s": 3600.0},
    )
    return Agent(config, FakeSource(gpus=2), host.inputs(), clock=lambda: clock[0])


async def test_the_agent_holds_routine_ticks_and_sends_an_xid_at_once(tmp_path: Path) -> None:
    host = FakeHost()
    clock = [100.0]
    agent = _agent(tmp_path, 3, host, clock)
    returned: list[Batch | None] = []
    try:
        for t in range(100, 106):
            clock[0] = float(t)
            if t == 103:
                host.kernel.append("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, fell off the bus")
            returned.append(await agent.step(float(t)))
        clock[0] = 106.0
        returned.append(await agent.step(106.0, final=True))
    finally:
        await agent.shutdown()
    assert agent.spool is not None
    spooled = [decode_agent_frame(agent.spool.read(seq) or b"") for seq in agent.spool.seqs()]
    batches = [b for b in spooled if isinstance(b, Batch)]
    assert [b.seq for b in batches] == list(range(batches[0].seq, batches[0].seq + len(batches)))
    assert [b for b in returned if b is not None] == batches
    # the first tick is a slow reading; then two held, the third sent; the Xid waits for its NVML twin
    # (collect.xid_merge_wait_s) and goes out at once with the ticks held before it; the final tick flushes
    xid_batch = next(b for b in batches if any(isinstance(e, XidOccurred) for e in b.events))
    assert _ticks_in(batches[0]) == [100.0]
    assert [s for b in batches for s in _ticks_in(b)] == [float(t) for t in range(100, 107)]
    assert all(len(_ticks_in(b)) <= 3 for b in batches)
    assert xid_batch.t == max(_ticks_in(xid_batch))
    assert returned[-1] is not None and agent.outbox.held_ticks == 0


def test_nvml_fast_reads_are_routine_and_slow_reads_are_not(fake_nvml: FakeNvml) -> None:
    """Through the real NVML source (pynvml faked at the library boundary): a fast read fills none of the
    slow-read fields, so healthy hosts do coalesce; every slow read is sent at once."""
    source = NvmlSource()
    source.open()
    try:
        fast = [source.read_fast(g, 10.0) for g in (0, 1)]
        slow = [source.read_slow(g, 11.0) for g in (0, 1)]
    finally:
        source.close()
    assert routine(Batch(seq=0, t=10.0, samples=fast))
    for sample in slow:
        assert not routine(Batch(seq=0, t=11.0, samples=[sample]))

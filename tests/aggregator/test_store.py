"""Durable state: verdicts and latched hardware facts survive a restart and close only through evidence."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.latches import FleetLatches
from sentinel.aggregator.server import restore_holds
from sentinel.aggregator.state import HostView
from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.aggregator.verdicts import Finding, VerdictBook
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, GpuSample, GpuWasReset, Hello, RowRemap, XidOccurred
from tests.aggregator.helpers import hello, sample


class Node:
    """One engine ("an aggregator process") with its store under ``state_dir``."""

    def __init__(self, state_dir: Path, now: float, config: AggregatorConfig | None = None) -> None:
        self.config = config or AggregatorConfig()
        self.engine = Engine(self.config)
        self.engine.book.restore_hold_s = restore_holds(self.config)
        self.store = StateStore(state_dir)
        self.restored = self.store.register(self.engine.book, now)
        self.restored += self.store.register(FleetLatches(self.engine.fleet), now)
        self.seq = 0
        self.views: dict[str, HostView] = {}

    def hello(self, message: Hello, now: float) -> None:
        self.views[message.host] = self.engine.hello(message, now)

    def send(self, host: str, t: float, samples: list[GpuSample] | None = None, **kwargs: object) -> None:
        samples = samples if samples is not None else [sample(i, t) for i in range(8)]
        self.seq += 1
        self.engine.ingest(self.views[host], Batch(seq=self.seq, t=t, samples=samples, **kwargs), t)  # type: ignore[arg-type]

    def persist(self) -> None:
        self.store.flush()
        assert self.store.wait_idle()

    def crash(self) -> None:
        """What a kill -9 leaves: only what was committed (no final flush)."""
        self.store.abandon()

    def open(self) -> list[tuple[str, str, str | None, int | None, str, float]]:
        return sorted(
            (v.id, v.kind, v.host, v.gpu, v.reason, v.opened_at) for v in self.engine.book.open.values()
        )


def xid(t: float, gpu: int, code: int, pid: int | None = None) -> XidOccurred:
    return XidOccurred(t=t, gpu=gpu, record=msgspec.structs.replace(xid_record(code), pid=pid))


def test_a_latched_xid_stays_open_across_a_restart_with_its_opened_time_and_closes_on_reset(
    tmp_path: Path,
) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    first.send("h0", 5.0, events=[xid(5.0, 3, 79)])
    before = first.open()
    assert [(k, h, g, r) for _, k, h, g, r, _ in before] == [("faulty", "h0", 3, "xid_79")]
    first.persist()
    first.crash()

    second = Node(tmp_path, 100.0)
    assert second.open() == before  # same id, same opened_at (5.0), still open
    second.hello(hello("h0"), 101.0)  # the agent comes back with the same boot id: not a reboot
    for t in range(102, 110):
        second.send("h0", float(t))  # healthy readings do not clear a latched Xid 79
        second.engine.tick(float(t))
    assert second.open() == before
    second.send("h0", 110.0, events=[GpuWasReset(t=110.0, gpu=3)])
    assert second.open() == []
    closed = second.engine.book.by_id[before[0][0]]
    assert closed.closed_at == 110.0 and closed.close_reason == "evidence gone"
    # the next verdict gets a new id, not one the restored history already used
    second.send("h0", 111.0, events=[xid(111.0, 5, 79)])
    assert second.open()[0][0] != before[0][0]


def test_a_reboot_seen_after_the_restart_is_evidence_and_closes_the_restored_verdict(tmp_path: Path) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    remap = RowRemap(pending=True, correctable=0, uncorrectable=1)
    first.send("h0", 2.0, samples=[sample(i, 2.0, remap=remap if i == 1 else None) for i in range(8)])
    assert [r for *_, r, _ in first.open()] == ["row_remap_pending_uncorrectable"]
    first.persist()
    first.crash()

    second = Node(tmp_path, 50.0)
    assert [r for *_, r, _ in second.open()] == ["row_remap_pending_uncorrectable"]
    second.engine.tick(51.0)
    # evaluated again on the restored readings, not on an empty GPU
    assert [r for *_, r, _ in second.open()] == ["row_remap_pending_uncorrectable"]
    rebooted = Hello(host="h0", boot_id="boot-2", gpus=hello("h0").gpus, started_at=52.0)
    second.hello(rebooted, 52.0)
    assert second.open() != []  # the reboot alone: the remap reading is still the pending one
    remapped = RowRemap(pending=False, correctable=0, uncorrectable=1)  # the reset applied the remap
    second.send("h0", 53.0, samples=[sample(i, 53.0, remap=remapped if i == 1 else None) for i in range(8)])
    assert second.open() == []


def test_the_xid_policy_repeat_history_survives_so_the_third_process_makes_the_gpu_suspect(
    tmp_path: Path,
) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    first.send("h0", 1.0, events=[xid(1.0, 2, 13, pid=101)])
    first.send("h0", 2.0, events=[xid(2.0, 2, 13, pid=102)])
    assert first.open() == []
    first.persist()
    first.crash()

    second = Node(tmp_path, 10.0)
    second.hello(hello("h0"), 10.0)
    second.send("h0", 11.0, events=[xid(11.0, 2, 13, pid=103)])
    assert [(k, g, r) for _, k, _, g, r, _ in second.open()] == [("degraded", 2, "xid_13_repeated")]


def test_what_was_not_flushed_is_lost_and_only_that(tmp_path: Path) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    first.send("h0", 1.0, events=[xid(1.0, 0, 79)])
    first.persist()
    first.send("h0", 2.0, events=[xid(2.0, 1, 79)])  # after the last flush: a kill -9 now loses it
    first.crash()
    second = Node(tmp_path, 10.0)
    assert [g for _, _, _, g, _, _ in second.open()] == [0]


def _finding(key: str, detector: str = "stuck") -> Finding:
    return Finding(
        key=(detector, key),
        detector=detector,
        kind="stuck",
        reason="not_entered_collective",
        action="restart_app",
        evidence=("rank 7 never entered allreduce seq 12",),
        evidence_t=1.0,
        job="train",
        rank=7,
    )


def test_a_restored_stuck_verdict_is_held_while_its_detector_gathers_fresh_heads(tmp_path: Path) -> None:
    book = VerdictBook()
    store = StateStore(tmp_path)
    store.register(book, 0.0)
    book.reconcile("stuck", [_finding("a"), _finding("b")], 1.0)
    store.flush()
    store.close()

    restored = VerdictBook()
    restored.restore_hold_s = {"stuck": 20.0}
    again = StateStore(tmp_path)
    again.register(restored, 100.0)
    ids = {v.key: v.id for v in restored.open.values()}
    # no heads yet: the detector finds nothing, but that is not evidence that the stall is over
    assert restored.reconcile("stuck", [], 105.0) == []
    # fresh heads show job a still stalled (same key: same verdict, same opened_at) and b moving again
    changes = restored.reconcile("stuck", [_finding("a")], 121.0)
    assert [(c.what, c.verdict.key) for c in changes] == [("closed", ("stuck", "b"))]
    assert restored.open[("stuck", "a")].id == ids[("stuck", "a")]
    assert restored.open[("stuck", "a")].opened_at == 1.0
    # held no longer: a later absence closes it at once
    assert [c.what for c in restored.reconcile("stuck", [], 122.0)] == ["closed"]
    again.close()


def test_closed_history_in_the_store_is_bounded_like_the_book(tmp_path: Path) -> None:
    book = VerdictBook(closed_kept=3)
    store = StateStore(tmp_path)
    store.register(book, 0.0)
    for i in range(10):
        book.reconcile("stuck", [_finding(str(i))], float(i))
        book.reconcile("stuck", [], float(i) + 0.5)
        store.flush()
    store.close()
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:
        (rows,) = db.execute("SELECT count(*) FROM records WHERE holder='verdicts'").fetchone()
    assert rows == 3 + 1  # three closed verdicts and the id counter
    restored = VerdictBook(closed_kept=3)
    StateStore(tmp_path).register(restored, 20.0)
    assert [v.key for v in restored.closed] == [("stuck", "7"), ("stuck", "8"), ("stuck", "9")]


def test_a_damaged_record_starts_that_holder_empty_and_is_counted(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    book = VerdictBook()
    store.register(book, 0.0)
    book.reconcile("stuck", [_finding("a")], 1.0)
    store.close()
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:
        db.execute("UPDATE records SET value=x'c1c1c1' WHERE holder='verdicts' AND key!='~meta'")
    again = StateStore(tmp_path)
    restored = VerdictBook()
    assert again.register(restored, 5.0) == 0
    assert restored.open == {} and again.write_errors == 1
    again.close()


class Memory:
    def __init__(self) -> None:
        self.state: dict[str, object] = {}
        self.restored: dict[str, object] | None = None

    def snapshot(self) -> dict[str, object]:
        return dict(self.state)

    def restore(self, state: dict[str, object]) -> None:
        self.restored = state


def test_detector_memory_is_written_when_it_changed_at_most_every_interval_and_restored(
    tmp_path: Path,
) -> None:
    clock = [0.0]
    memory = Memory()
    holder = BuiltinsHolder("detectors", {"streaks": memory}, min_interval_s=10.0, clock=lambda: clock[0])
    memory.state = {"hits": [["gpu", "h0", "3"], 2]}
    assert list(holder.snapshot()) == ["streaks"]
    memory.state = {"hits": [["gpu", "h0", "3"], 3]}
    clock[0] = 5.0
    assert holder.snapshot() == {}  # within the interval
    clock[0] = 10.0
    assert list(holder.snapshot()) == ["streaks"]
    clock[0] = 20.0
    assert holder.snapshot() == {}  # unchanged: nothing to write
    store = StateStore(tmp_path)
    store.register(holder, 0.0)
    store.flush(full=True)
    store.close()
    again = Memory()
    StateStore(tmp_path).register(BuiltinsHolder("detectors", {"streaks": again}), 30.0)
    assert again.restored == {"hits": [["gpu", "h0", "3"], 3]}


def test_a_restarted_engine_rechecks_every_restored_gpu_on_its_first_tick(tmp_path: Path) -> None:
    first = Node(tmp_path, 0.0)
    first.store.register(BuiltinsHolder("detectors", dict(first.engine.detectors)), 0.0)
    first.hello(hello("h0"), 0.0)
    first.send("h0", 1.0, events=[xid(1.0, 4, 79)])
    first.persist()
    first.store.flush(full=True)
    first.crash()
    second = Node(tmp_path, 10.0)
    second.store.register(BuiltinsHolder("detectors", dict(second.engine.detectors)), 10.0)
    changes = second.engine.tick(11.0)
    assert changes == []  # evaluated on the restored facts: the same verdict, nothing opened or closed
    assert [(g, r) for _, _, _, g, r, _ in second.open()] == [(4, "xid_79")]


def test_a_host_the_fleet_forgot_is_deleted_from_the_store(tmp_path: Path) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    first.hello(hello("h1"), 0.0)
    first.persist()
    first.engine.forget_host("h1", 0.0)  # retention forgot it (its verdicts closed)
    first.persist()
    first.crash()
    assert sorted(Node(tmp_path, 5.0).engine.fleet.hosts) == ["h0"]


def test_the_stragglers_memory_of_the_seeds_two_24576_rank_jobs_fits_the_store_and_comes_back(
    tmp_path: Path,
) -> None:
    """At job scale the straggler's step histories are the largest detector memory (~15 MB for two 24,576-rank
    jobs with full windows); a per-member cap below that skipped it on every flush, so a restart lost the warm
    start exactly where it matters most."""
    from collections import deque

    from sentinel.aggregator.detectors.straggler import RankSteps, StragglerDetector

    config = AggregatorConfig()
    window = config.detect.straggler.compute_window_steps
    detector = StragglerDetector(config)
    detector.steps = {
        f"job-{j}": {
            rank: RankSteps(
                last_seq=1000 + rank,
                compute=deque((0.8 + rank * 1e-6 + i * 1e-3 for i in range(window)), maxlen=window),
            )
            for rank in range(24_576)
        }
        for j in range(2)
    }
    holder = BuiltinsHolder("detectors", {"straggler": detector})
    written = holder.snapshot(full=True)
    assert holder.oversize == 0 and "straggler" in written
    store = StateStore(tmp_path)
    store.register(holder, 0.0)
    store.flush(full=True)
    store.close()
    again = StragglerDetector(config)
    StateStore(tmp_path).register(BuiltinsHolder("detectors", {"straggler": again}), 30.0)
    assert again.steps.keys() == detector.steps.keys()
    assert again.steps["job-1"][24_575].last_seq == 1000 + 24_575
    assert list(again.steps["job-1"][24_575].compute) == list(detector.steps["job-1"][24_575].compute)


def test_a_member_over_the_cap_is_skipped_counted_in_a_metric_and_the_others_are_written(
    tmp_path: Path,
) -> None:
    """The skip used to be a log line only; SentinelStateSnapshotTooLarge watches the counter, which is
    exported (at 0) for every member so the alert's expression has a series before the first skip."""
    from sentinel.aggregator.metrics import AggregatorMetrics

    small, large = Memory(), Memory()
    small.state = {"hits": [1]}
    large.state = {"steps": list(range(5000))}
    holder = BuiltinsHolder("detectors", {"small": small, "large": large}, max_bytes=1024)
    store = StateStore(tmp_path)
    store.register(holder, 0.0)
    metrics = AggregatorMetrics("c1")
    metrics.store = store

    def too_large() -> dict[str, float]:
        family = next(
            f for f in metrics.state_families() if f.name == "sentinel_aggregator_state_snapshots_too_large"
        )
        return {s.labels["member"]: s.value for s in family.samples if s.name.endswith("_total")}

    assert too_large() == {"small": 0.0, "large": 0.0}
    written = holder.snapshot(full=True)
    assert list(written) == ["small"]
    assert too_large() == {"small": 0.0, "large": 1.0}
    store.close()

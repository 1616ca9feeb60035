"""Durable state: verdicts and latched hardware facts survive a restart and close only through evidence."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.aggregator.verdicts import Finding, VerdictBook
from sentinel.config.aggregator import AggregatorConfig
from tests.aggregator.durable import Node, xid
from tests.aggregator.helpers import hello


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

"""Detectors through the engine with an injected clock: open once, update, close when the evidence is gone."""

from __future__ import annotations

import functools
from collections.abc import Collection
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.aggregator.detectors.base import run_steps
from sentinel.aggregator.detectors.stuck import evaluate_job_steps
from sentinel.aggregator.state import JobView
from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.aggregator.verdicts import Finding, VerdictBook
from sentinel.components.clocks.record import ClockViolations
from sentinel.components.vocab import Action, VerdictKind
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.fr.ops import is_send, p2p_peer
from sentinel.wire import (
    LogLine,
    NvLink,
    ProcInfo,
)
from tests.aggregator.helpers import Fleet, sample

# The hardware detector's signals are tested next to each signal: tests/components/<name>/test_verdicts.py.

# -- stuck ----------------------------------------------------------------------------------------------


def heads(rank: int, t: float, pgs: list[PgHead], host: str, gpu: int, job: str = "j") -> FrHeads:
    return FrHeads(rank=rank, t=t, job_id=job, world_size=16, host=host, gpu=gpu, pgs=pgs)


def pg(
    name: str,
    completed: int,
    waiting_age: float | None = None,
    ranks: list[int] | None = None,
    op: str = "allreduce",
) -> PgHead:
    """A group where this rank completed ``completed`` and, if ``waiting_age``, waits in the next one."""
    flight = [InFlight(seq=completed + 1, op=op, age_s=waiting_age, state="started")] if waiting_age else []
    return PgHead(
        pg_name=name,
        pg_desc="default_pg" if name == "world" else "tp",
        ranks=ranks,
        last_enqueued_seq=completed + (1 if waiting_age else 0),
        last_started_seq=completed + (1 if waiting_age else 0),
        last_completed_seq=completed,
        in_flight=flight,
    )


def procs(host_index: int) -> list[ProcInfo]:
    return [
        ProcInfo(gpu=g, pid=1000 + g, job_id="j", rank=host_index * 8 + g, world_size=16) for g in range(8)
    ]


def feed_cascade(
    f: Fleet,
    t: float,
    age: float,
    completed: int = 10,
    op_known_by: Collection[int] | None = None,
    extra: dict[int, InFlight] | None = None,
) -> None:
    """Rank 3 (h0 gpu 3) hangs before tp seq 11; its tp peers wait in tp, h1's ranks wait in world.

    ``op_known_by``: the ranks whose heads carry the waited collective's op (the others say ``unknown``, as
    the probe's heads do between its detailed dumps); every rank when None."""
    tp0 = list(range(8))

    def op(rank: int) -> str:
        return "allreduce" if op_known_by is None or rank in op_known_by else "unknown"

    h0 = [
        heads(
            r,
            t,
            [pg("tp0", completed, None if r == 3 else age, tp0, op(r)), pg("world", completed - 1)],
            "h0",
            r,
        )
        for r in range(8)
    ]
    for r, flight in (extra or {}).items():  # one more in-flight op in rank r's world group
        h0[r].pgs[1].in_flight.append(flight)
    h1 = [
        heads(
            8 + g,
            t,
            [pg("tp1", completed, None, list(range(8, 16))), pg("world", completed - 1, age)],
            "h1",
            g,
        )
        for g in range(8)
    ]
    h0_samples = [sample(g, t, util_gpu_pct=0.0 if g == 3 else 100.0) for g in range(8)]
    f.send("h0", t, samples=h0_samples, heads=h0, procs=procs(0) if t == 0 else None)
    f.send("h1", t, heads=h1, procs=procs(1) if t == 0 else None)


def _running_cascade() -> Fleet:
    """The cascade job making progress for two heads rounds (t = 0 and 2 s): what a stall starts from."""
    f = Fleet()
    for t in (0.0, 2.0):
        feed_cascade(f, t, age=0.1, completed=10 + int(t))
        f.engine.tick(t)
    return f


def test_stuck_follows_the_wait_across_groups_to_the_root_and_never_blames_a_waiting_peer() -> None:
    f = Fleet()
    for t in (0.0, 2.0):  # healthy: progress on every snapshot
        feed_cascade(f, t, age=0.1, completed=10 + int(t))
        f.engine.tick(t)
    assert f.open() == []
    for t in (4.0, 6.0, 8.0):
        feed_cascade(f, t, age=t - 3.0, completed=12)
        f.engine.tick(t)
    stuck = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert [(v.host, v.gpu, v.rank, v.reason) for v in stuck] == [("h0", 3, 3, "not_entered_collective")]
    evidence = " ".join(stuck[0].evidence)
    assert "idles" in evidence and "never entered" in evidence
    assert f.engine.stalls["j"].culprits == [3]
    # the job moves again: the verdict closes
    feed_cascade(f, 10.0, age=0.1, completed=20)
    f.engine.tick(10.0)
    assert [v for v in f.engine.book.open.values() if v.kind == "stuck"] == []


def test_stall_evidence_names_the_op_when_most_waiting_ranks_report_it_unknown() -> None:
    f = _running_cascade()
    for t in (4.0, 6.0, 8.0):
        feed_cascade(f, t, age=t - 3.0, completed=12, op_known_by={6})  # one tp waiter had a detailed dump
        f.engine.tick(t)
    (stuck,) = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert stuck.rank == 3
    evidence = " ".join(stuck.evidence)
    assert "in allreduce" in evidence and "in unknown" not in evidence
    assert f.engine.stalls["j"].op == "allreduce"


def test_a_culprit_blocked_in_io_is_named_an_io_hang_not_a_gpu_or_network_fault() -> None:
    f = _running_cascade()
    blocked = [
        ProcInfo(gpu=g, pid=1000 + g, job_id="j", rank=g, world_size=16, blocked_io=g == 3) for g in range(8)
    ]
    f.send("h0", 3.0, procs=blocked)  # the agent: rank 3's process is in D state
    for t in (4.0, 6.0, 8.0):
        feed_cascade(f, t, age=t - 3.0, completed=12)
        f.engine.tick(t)
    stuck = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert [(v.rank, v.reason, v.action) for v in stuck] == [(3, "io_hang", "drain")]
    assert any("uninterruptible sleep" in e for e in stuck[0].evidence)


def _stalled_cascade() -> Fleet:
    f = _running_cascade()
    for t in (4.0, 6.0, 8.0):
        feed_cascade(f, t, age=t - 3.0, completed=12)
        f.engine.tick(t)
    return f


def _stuck(f: Fleet) -> list[tuple[int | None, str, str]]:
    return sorted(
        (v.rank, v.reason, " ".join(v.evidence)) for v in f.engine.book.open.values() if v.kind == "stuck"
    )


@pytest.mark.parametrize(
    ("analysis", "outcome", "ranks"),
    [
        ({"verdict": "hang", "culprit_ranks": [3], "findings": ["rank 3 never joined"]}, "confirmed", [3]),
        (
            {"verdict": "hang", "culprit_ranks": [5], "findings": ["rank 5 is behind by 2 collectives"]},
            "corrected",
            [5],
        ),
        ({"error": "no dump arrived"}, "inconclusive", [3]),
        ({"verdict": "healthy", "culprit_ranks": []}, "inconclusive", [3]),
    ],
)
def test_the_dumps_analysis_confirms_corrects_or_is_inconclusive_on_the_live_verdict(
    analysis: dict[str, object], outcome: str, ranks: list[int]
) -> None:
    f = _stalled_cascade()
    assert [r for r, _, _ in _stuck(f)] == [3]
    assert f.engine.join_dumps("j", analysis) == outcome
    feed_cascade(f, 10.0, age=7.0, completed=12)
    f.engine.tick(10.0)
    found = _stuck(f)
    assert [r for r, _, _ in found] == ranks
    text = found[0][2]
    expected_word = {"confirmed": "dumps confirm", "corrected": "corrected by the Flight Recorder dumps"}
    assert expected_word.get(outcome, "dumps inconclusive") in text
    assert f.engine.stalls["j"].fr_outcome == outcome
    if outcome == "corrected":
        assert found[0][1] == "fr_hang" and "named rank(s) 3" in text


def test_dumps_for_a_stall_that_is_over_are_not_joined() -> None:
    f = Fleet()
    feed_cascade(f, 0.0, age=0.1, completed=10)
    f.engine.tick(0.0)
    assert f.engine.join_dumps("j", {"verdict": "hang", "culprit_ranks": [1]}) is None


def test_a_call_order_deadlock_names_both_ranks_of_the_cycle_and_no_victim() -> None:
    """Ranks 0 and 1 enter their two groups in opposite orders: 0 waits in a for 1, 1 waits in b for 0; the
    world waits for both. The same wait graph as the dump analysis finds the cycle."""
    f = Fleet()
    pair = [0, 1]

    def feed(t: float, age: float | None, completed: int) -> None:
        for host, base in (("h0", 0), ("h1", 8)):
            hs = []
            for g in range(8):
                rank = base + g
                if rank == 0:
                    pgs = [
                        pg("a", completed, age, pair),
                        pg("b", completed, None, pair),
                        pg("world", completed),
                    ]
                elif rank == 1:
                    pgs = [
                        pg("a", completed, None, pair),
                        pg("b", completed, age, pair),
                        pg("world", completed),
                    ]
                else:
                    pgs = [pg("world", completed, age)]
                hs.append(heads(rank, t, pgs, host, g))
            f.send(host, t, heads=hs, procs=procs(base // 8) if t == 0 else None)

    for t in (0.0, 2.0):
        feed(t, None, 10 + int(t))
        f.engine.tick(t)
    for t in (4.0, 6.0, 8.0):
        feed(t, t - 3.0, 12)
        f.engine.tick(t)
    stuck = sorted((v.rank, v.reason) for v in f.engine.book.open.values() if v.kind == "stuck")
    assert stuck == [(0, "deadlock"), (1, "deadlock")]
    assert all("call-order deadlock" in " ".join(v.evidence) for v in f.engine.book.open.values())


def test_all_ranks_inside_with_nccl_net_errors_names_the_rank_with_the_errors() -> None:
    f = Fleet()
    nccl = "h1:1005:1011 [5] transport/net_ib.cc:2244 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<53908> with status=12"
    for t, age, completed in ((0.0, 0.1, 10), (2.0, 0.1, 11), (4.0, 1.0, 12), (6.0, 3.0, 12), (8.0, 5.0, 12)):
        for host, base in (("h0", 0), ("h1", 8)):
            hs = [heads(base + g, t, [pg("world", completed, age)], host, g) for g in range(8)]
            events = []
            if host == "h1" and t == 4.0:
                # the agent classified the line: its pid (the aggregator maps it to the rank's GPU)
                events = [LogLine(t=t, severity="warning", text=nccl, line_kind="nccl_warn_net", pid=1005)]
            f.send(host, t, heads=hs, events=events, procs=procs(base // 8) if t == 0 else None)
        f.engine.tick(t)
    stuck = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert [(v.host, v.gpu, v.rank, v.reason) for v in stuck] == [("h1", 5, 13, "nccl_net_error")]


def test_all_ranks_inside_without_evidence_is_a_long_collective_until_the_unexplained_wait() -> None:
    f = Fleet()
    limit = f.engine.config.detect.stuck.unexplained_wait_s
    completed = 12
    for t in (0.0, 2.0, 4.0, 8.0, 30.0, limit - 1.0, limit + 5.0):
        age = max(t - 3.0, 0.1)
        for host, base in (("h0", 0), ("h1", 8)):
            hs = [heads(base + g, t, [pg("world", completed, age)], host, g) for g in range(8)]
            f.send(host, t, heads=hs, procs=procs(base // 8) if t == 0 else None)
        f.engine.tick(t)
        stuck = [(v.rank, v.reason) for v in f.engine.book.open.values() if v.kind == "stuck"]
        if age < limit:
            assert stuck == [], f"a {age:.0f}s collective with no evidence is not a stall yet"
    assert stuck == [(None, "collective_stalled")]


def test_no_heads_watchdog_timeouts_name_the_rank_that_did_not_time_out() -> None:
    f = Fleet()
    events = [
        LogLine(
            t=5.0, severity="critical", text="watchdog", line_kind="torch_watchdog_timeout", rank=r, seq=42
        )
        for r in range(16)
        if r != 9
    ]
    f.send("h0", 0.0, procs=procs(0))
    f.send("h1", 0.0, procs=procs(1))
    f.send("h0", 5.0, events=events)
    f.engine.tick(40.0)
    assert [(v.host, v.gpu, v.rank) for v in f.engine.book.open.values() if v.kind == "stuck"] == [
        ("h1", 1, 9)
    ]


# -- straggler ------------------------------------------------------------------------------------------


def test_one_noisy_sample_never_opens_a_straggler_and_a_persistent_thermal_one_does() -> None:
    f = Fleet(hosts=4)
    t = 0.0
    for step in range(40):
        t = float(step)
        for host in f.views:
            samples = [sample(i, t, sm_clock_mhz=1975.0 + (i % 3)) for i in range(8)]
            if host == "h2" and step == 10:
                samples[5] = sample(5, t, sm_clock_mhz=1000.0, throttle=["hw_thermal_slowdown"])  # one glitch
            f.send(host, t, samples=samples)
        f.engine.tick(t)
    assert f.open() == []
    opened_at = None
    for step in range(40, 120):
        t = float(step)
        for host in f.views:
            samples = [sample(i, t, sm_clock_mhz=1975.0 + (i % 3)) for i in range(8)]
            if host == "h2":
                samples[5] = sample(5, t, sm_clock_mhz=1100.0, temp_c=91.0, throttle=["hw_thermal_slowdown"])
            f.send(host, t, samples=samples)
        f.engine.tick(t)
        if opened_at is None and f.open():
            opened_at = t
    assert f.open() == [("straggler", "h2", 5, "thermal")]
    assert opened_at is not None and opened_at - 40 <= 60


# -- host silent ----------------------------------------------------------------------------------------


def test_host_silent_opens_after_the_threshold_and_closes_when_heard_again() -> None:
    f = Fleet()
    for t in range(0, 30):
        f.send("h0", float(t))
        if t < 5 or t >= 25:
            f.send("h1", float(t))
        f.engine.tick(float(t))
        if t == 13:
            assert f.open() == []  # 9 s of silence
        if t == 14:  # 10 s: the threshold
            assert f.open() == [("host_silent", "h1", None, "no_heartbeat")]
    assert f.open() == []


# -- the book -------------------------------------------------------------------------------------------


def finding(
    kind: VerdictKind, reason: str, action: Action = "none", evidence: tuple[str, ...] = ("e",)
) -> Finding:
    return Finding(
        key=("k",), detector="d", kind=kind, reason=reason, action=action, evidence=evidence, evidence_t=0.0
    )


def test_verdict_book_opens_once_escalates_and_closes() -> None:
    book = VerdictBook()
    changes = book.reconcile("d", [finding("degraded", "a")], 1.0)
    assert [c.what for c in changes] == ["opened"]
    assert book.reconcile("d", [finding("degraded", "a")], 2.0) == []
    changes = book.reconcile("d", [finding("faulty", "b", "rma", ("e", "f"))], 3.0)
    assert [c.what for c in changes] == ["updated"]
    verdict = changes[0].verdict
    assert (verdict.kind, verdict.reason, verdict.action, verdict.opened_at) == ("faulty", "b", "rma", 1.0)
    changes = book.reconcile("other", [], 4.0)
    assert changes == [] and verdict.state == "open"  # another detector cannot close it
    changes = book.reconcile("d", [], 5.0)
    assert [c.what for c in changes] == ["closed"] and verdict.closed_at == 5.0
    assert [v.id for v in book.all()] == [verdict.id]


def test_stuck_verdict_closes_when_the_job_ends() -> None:
    f = _stalled_cascade()
    verdict = f.engine.book.open[("stuck", "j", "3")]
    # the job is killed: its processes disappear from both hosts, no more heads
    f.send("h0", 9.0, procs=[])
    f.send("h1", 9.0, procs=[])
    for t in range(10, 50):
        f.send("h0", float(t))
        f.send("h1", float(t))
        f.engine.tick(float(t))
    assert verdict.state == "closed" and "j" not in f.engine.fleet.jobs
    assert [v for v in f.engine.book.open.values() if v.kind == "stuck"] == []


def test_a_job_that_ends_between_snapshots_is_not_stuck() -> None:
    """The last heads of a finishing job catch some ranks inside the final collective and others not yet
    in it; then every rank stops reporting. Extrapolating those waits must not open a stall."""
    f = Fleet()
    for t in (0.0, 1.0, 2.0):
        feed_cascade(f, t, age=0.1, completed=10 + int(t))
        f.engine.tick(t)
    feed_cascade(f, 3.0, age=0.3, completed=13)  # the last snapshot: waits just begun
    for t in (3.0, 4.0, 5.0, 6.0, 7.0, 7.5, 7.9, 8.5, 9.0, 12.0):
        f.engine.tick(t)
        assert f.open() == [], t
    # the same picture with waits the ranks themselves saw grow is a stall
    g = Fleet()
    for t in (0.0, 1.0, 2.0):
        feed_cascade(g, t, age=0.1, completed=10 + int(t))
        g.engine.tick(t)
    for t in (3.0, 4.0, 5.0, 6.0, 7.0):
        feed_cascade(g, t, age=t - 2.7, completed=13)
        g.engine.tick(t)
    assert [v.rank for v in g.engine.book.open.values() if v.kind == "stuck"] == [3]


def test_step_time_is_steady_when_snapshots_are_slower_than_steps() -> None:
    """Heads every 2 s, a step every 4/3 s: seq advances 1, 2, 1, 2... per snapshot; the step stays ~1.33 s."""
    f = Fleet(hosts=1)
    steps: list[float] = []
    for k in range(30):
        t = 2.0 * k
        completed = int(t / (4.0 / 3.0))
        hs = [heads(g, t, [pg("world", completed)], "h0", g) for g in range(8)]
        f.send("h0", t, heads=hs, procs=procs(0) if k == 0 else None)
        step = f.engine.fleet.jobs["j"].step_s
        if k >= 10 and step is not None:
            steps.append(step)
    assert steps
    assert all(abs(step - 4.0 / 3.0) < 0.15 for step in steps), steps


def test_a_large_stall_is_examined_again_every_recheck_but_progress_closes_it_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sentinel.aggregator.detectors import stuck

    monkeypatch.setattr(stuck, "LARGE_JOB_RANKS", 16)  # this 16-rank job counts as large
    calls: list[float] = []
    real = stuck.evaluate_job_steps

    def counted(job: JobView, *args: object) -> object:
        calls.append(args[3])  # type: ignore[arg-type]  # (fleet, cfg, hw, now, ...)
        return real(job, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(stuck, "evaluate_job_steps", counted)
    f = _running_cascade()
    for t in (4.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0):
        feed_cascade(f, t, age=t - 3.0, completed=12)
        f.engine.tick(t)
    assert ("stuck", "j", "3") in f.engine.book.open
    stalled_calls = [t for t in calls if t >= 7.0]
    assert stalled_calls and len(stalled_calls) <= 2  # re-examined at most every RECHECK_S, not each tick
    feed_cascade(f, 13.0, age=0.1, completed=13)  # the job moves again
    f.engine.tick(13.0)
    assert ("stuck", "j", "3") not in f.engine.book.open


def _violations(t: float, power_share: float) -> ClockViolations:
    return ClockViolations(reference_us=int(t * 1e6), power=int(t * power_share * 1e9), thermal=0)


def _slow_gpu_fleet(host: str, gpu: int, power_share: float) -> Fleet:
    """Four hosts of busy GPUs; from t=20 on ``host``/``gpu`` runs at 1500 MHz, its power policy holding
    it back ``power_share`` of the time (no reason bits caught it)."""
    f = Fleet(hosts=4)
    for step in range(0, 120, 2):
        t = float(step)
        for name in f.views:
            samples = [
                sample(i, t, sm_clock_mhz=1975.0 + (i % 3), violations=_violations(t, 0.0)) for i in range(8)
            ]
            if name == host and step >= 20:
                samples[gpu] = sample(gpu, t, sm_clock_mhz=1500.0, violations=_violations(t, power_share))
            f.send(name, t, samples=samples)
        f.engine.tick(t)
    return f


def test_a_straggler_at_its_power_limit_is_named_power_from_violation_time_alone() -> None:
    """The reason bits are one instant per tick and may miss a GPU capped 70% of the time; NVML's
    violation time integrates it."""
    f = _slow_gpu_fleet("h1", 6, 0.7)
    assert f.open() == [("straggler", "h1", 6, "power")]
    verdict = next(iter(f.engine.book.open.values()))
    assert verdict.action == "drain"
    assert any("power 70% of the last 2 s (NVML violation time)" in e for e in verdict.evidence)
    assert verdict.learned_from == 3  # slow against the median of the three other hosts' GPUs


def test_a_straggler_without_violation_time_or_reason_bits_stays_unknown() -> None:
    f = _slow_gpu_fleet("h3", 1, 0.1)
    assert f.open() == [("straggler", "h3", 1, "unknown")]
    assert any("power 10% of the last 2 s" in e for e in next(iter(f.engine.book.open.values())).evidence)


def test_a_slow_gpu_whose_nvlink_errors_climb_is_a_straggler_for_that_reason() -> None:
    f = Fleet(hosts=4)
    for step in range(0, 120, 2):
        t = float(step)
        for name in f.views:
            samples = [sample(i, t, sm_clock_mhz=1975.0 + (i % 3)) for i in range(8)]
            if name == "h2" and step >= 20:
                links = [NvLink(link=0), NvLink(link=5, replay_errors=40 * step)]
                samples[3] = sample(3, t, sm_clock_mhz=1500.0, nvlink=links)
            f.send(name, t, samples=samples)
        f.engine.tick(t)
    stragglers = [v for v in f.engine.book.open.values() if v.kind == "straggler"]
    assert [(v.host, v.gpu, v.reason, v.action) for v in stragglers] == [
        ("h2", 3, "nvlink_errors", "reset_gpu")
    ]
    assert any("NVLink errors at" in e and "link 5 replay +80" in e for e in stragglers[0].evidence)


def _restarted(f: Fleet, state_dir: Path, now: float) -> Fleet:
    """A restart: the detectors' memory through the real state store into a new engine; its fleet view is
    rebuilt only from the agents' next batches."""
    old = StateStore(state_dir)
    old.register(BuiltinsHolder("detectors", dict(f.engine.detectors)), now)
    old.close()
    again = Fleet()
    new = StateStore(state_dir)
    new.register(BuiltinsHolder("detectors", dict(again.engine.detectors)), now + 1.0)
    new.close()
    return again


def test_a_culprit_corrected_by_the_dumps_stays_corrected_across_an_aggregator_restart(
    tmp_path: Path,
) -> None:
    f = _stalled_cascade()
    analysis = {"verdict": "hang", "culprit_ranks": [5], "findings": ["rank 5 is behind by 2 collectives"]}
    assert f.engine.join_dumps("j", analysis) == "corrected"
    feed_cascade(f, 10.0, age=7.0, completed=12)
    f.engine.tick(10.0)
    assert [r for r, _, _ in _stuck(f)] == [5]
    again = _restarted(f, tmp_path, 10.0)
    for t in (12.0, 14.0, 16.0):
        feed_cascade(again, t, age=t - 3.0, completed=12)
        again.engine.tick(t)
    found = _stuck(again)
    assert [r for r, _, _ in found] == [5]  # the dumps' culprit, not the heads' rank 3
    assert found[0][1] == "fr_hang" and "corrected by the Flight Recorder dumps" in found[0][2]
    assert again.engine.stalls["j"].fr_outcome == "corrected"
    # the stall ends: the judgement goes with it, the next stall is judged afresh
    feed_cascade(again, 18.0, age=0.1, completed=30)
    again.engine.tick(18.0)
    assert _stuck(again) == [] and again.engine.detectors["stuck"].dumps == {}  # type: ignore[attr-defined]


def test_a_restored_dump_judgement_whose_stall_never_returns_is_dropped(tmp_path: Path) -> None:
    f = _stalled_cascade()
    assert f.engine.join_dumps("j", {"verdict": "hang", "culprit_ranks": [5]}) == "corrected"
    f.engine.tick(9.0)
    again = _restarted(f, tmp_path, 9.0)
    for t in range(10, 120, 2):  # the job is moving again after the restart
        feed_cascade(again, float(t), age=0.1, completed=40 + t)
        again.engine.tick(float(t))
    assert _stuck(again) == [] and again.engine.detectors["stuck"]._restored == {}  # type: ignore[attr-defined]


def test_a_pending_send_recv_is_not_read_as_a_collective_wait() -> None:
    """Heads carry in-flight p2p ops too (``p2p``: ``seq`` is the p2p_seq_id, another numbering): rank 3
    also has a recv from rank 11 pending. Read as a wait in world collective #40, every rank would be
    'missing' from a collective nobody reached and rank 3 a waiter; it stays the culprit."""
    f = _running_cascade()
    for t in (4.0, 6.0, 8.0):
        recv = InFlight(seq=40, op="nccl:recv 3<-11", age_s=t - 3.0, state="started", p2p=True)
        feed_cascade(f, t, age=t - 3.0, completed=12, extra={3: recv})
        f.engine.tick(t)
    stuck = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert [(v.rank, v.reason) for v in stuck] == [(3, "not_entered_collective")]
    assert "seq 40" not in " ".join(stuck[0].evidence)


def _feed_dp_and_recv(f: Fleet, t: float, dp_age: float | None, recv_age: float | None) -> None:
    """16 ranks on two hosts, all in world seq 12; rank 0 waits ``dp_age`` in its dp all_reduce with rank 1,
    which (when ``recv_age`` is set) is blocked that long in a recv from rank 5."""
    out: dict[str, list[FrHeads]] = {"h0": [], "h1": []}
    for r in range(16):
        pgs = [pg("world", 12)]
        if r in (0, 1):
            pgs.append(pg("dp0", 12, dp_age if r == 0 else None, [0, 1]))
        if r == 1 and recv_age is not None:
            recv = InFlight(seq=30, op="nccl:recv 1<-5", age_s=recv_age, state="started", p2p=True)
            pgs[0] = msgspec.structs.replace(pgs[0], in_flight=[recv])
        out["h0" if r < 8 else "h1"].append(heads(r, t, pgs, "h0" if r < 8 else "h1", r % 8))
    f.send("h0", t, heads=out["h0"], procs=procs(0) if t == 0 else None)
    f.send("h1", t, heads=out["h1"], procs=procs(1) if t == 0 else None)


def test_a_rank_blocked_in_a_recv_leads_to_the_peer_that_never_sent() -> None:
    """Pipeline-style live heads: rank 0 waits in its dp all_reduce for rank 1, which is blocked in a recv
    from rank 5 (idle: it never sent). The culprit is rank 5, not the rank inside the recv."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_dp_and_recv(f, t, None, None)
        f.engine.tick(t)
    for t in (4.0, 6.0, 8.0):
        _feed_dp_and_recv(f, t, t - 3.0, t - 3.0)
        f.engine.tick(t)
    stuck = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert [(v.rank, v.reason) for v in stuck] == [(5, "not_entered_collective")], [v.evidence for v in stuck]
    assert "never posted the send that rank 1 waits for in recv" in " ".join(stuck[0].evidence)


def test_a_recv_entered_mid_stall_moves_the_blame_once_it_is_old_enough() -> None:
    """The stall is first rank 1's (rank 0 waits for it in dp); then rank 1 reports a recv from rank 5, too
    young to count. The kept examination must expire when that recv reaches min_wait_s even though no head
    moves (same progress, larger ages): from then on the culprit is rank 5, as a fresh examination says."""
    f = Fleet()
    feed = functools.partial(_feed_dp_and_recv, f)

    def culprits() -> list[int]:
        return sorted(v.rank for v in f.engine.book.open.values() if v.kind == "stuck" and v.rank is not None)

    for t in (0.0, 2.0):
        feed(t, None, None)
        f.engine.tick(t)
    seen = []
    for step in range(4, 24, 2):
        t = float(step)
        feed(t, t - 3.0, t - 9.0 if t >= 10 else None)
        f.engine.tick(t)
        seen.append(culprits())
    cfg = f.engine.config.detect
    fresh, _ = run_steps(
        evaluate_job_steps(
            f.engine.fleet.jobs["j"], f.engine.fleet, cfg.stuck, cfg.hardware, 22.0, cfg.network
        )
    )
    assert [x.rank for x in fresh] == [5]
    assert [1] in seen  # rank 1's stall was named first
    assert seen[-1] == [5], seen


# -- stuck: every stalled rank blocked in send/recv (no collective stalled) ---------------------------------


def _feed_p2p(
    f: Fleet,
    t: float,
    ops: dict[int, tuple[str, float]],
    completed: int = 12,
    silent: Collection[int] = (),
    unconfirmed: Collection[int] = (),
) -> None:
    """16 ranks in the world group; rank r has the pending p2p op ``ops[r]`` = (profiling name, age) or none;
    ``silent`` ranks send no heads; ``unconfirmed`` ranks' ops are reported unconfirmed. The world group
    holds every rank, so the group-local peers in the names are the global ranks."""
    out: dict[str, list[FrHeads]] = {"h0": [], "h1": []}
    for r in range(16):
        if r in silent:
            continue
        world = pg("world", completed)
        if r in ops:
            name, age = ops[r]
            flight = InFlight(
                seq=30 + r, op=name, age_s=age, state="started", p2p=True, unconfirmed=r in unconfirmed
            )
            world = msgspec.structs.replace(world, in_flight=[flight])
        host = "h0" if r < 8 else "h1"
        out[host].append(heads(r, t, [world], host, r % 8))
    f.send("h0", t, heads=out["h0"], procs=procs(0) if t == 0 else None)
    f.send("h1", t, heads=out["h1"], procs=procs(1) if t == 0 else None)


def _pipeline_stall(f: Fleet, t: float, age: float) -> None:
    """A 16-stage pipeline whose stage 9 never forwards its activation: stages 10..15 block in the recv of
    theirs from the stage before, stages 0..8 in the recv of their gradient from the stage after; rank 9
    sits in no send/recv nor collective."""
    ops = {r: (f"nccl:recv {r}<-{r - 1}", age) for r in range(10, 16)}
    ops.update({r: (f"nccl:recv {r}<-{r + 1}", age) for r in range(9)})
    _feed_p2p(f, t, ops)


def test_unconfirmed_send_recv_are_no_waits_until_confirmed() -> None:
    """The pipeline stall below with every op reported unconfirmed (each may be a completed one-op batch's
    member): no verdict however old, at no min_wait_s; the first heads that report them confirmed are
    counted at once. The probe's ages carry no capping for the detector's thresholds any more."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_p2p(f, t, {}, completed=10 + int(t))
        f.engine.tick(t)
    everyone = range(16)
    for t in (4.0, 6.0, 8.0, 10.0, 30.0):
        ops = {r: (f"nccl:recv {r}<-{r - 1}", t - 3.0) for r in range(10, 16)}
        ops.update({r: (f"nccl:recv {r}<-{r + 1}", t - 3.0) for r in range(9)})
        _feed_p2p(f, t, ops, unconfirmed=everyone)
        f.engine.tick(t)
        assert _stuck(f) == []
    assert _shown_flights(f, 30.0) == [
        {"seq": 30 + r, "op": ops[r][0], "age_s": 27.0, "unconfirmed": True} for r in sorted(ops)
    ]
    _pipeline_stall(f, 32.0, 29.0)
    f.engine.tick(32.0)
    assert [(r, why) for r, why, _ in _stuck(f)] == [(9, "not_entered_collective")]
    assert _shown_flights(f, 32.0)[0] == {"seq": 30, "op": "nccl:recv 0<-1", "age_s": 29.0}


def _shown_flights(f: Fleet, now: float) -> list[dict[str, object]]:
    """The in-flight ops the job view (API, status page) shows, every rank's in order."""
    from sentinel.aggregator.views import job_detail

    detail = job_detail(f.engine, f.engine.fleet.jobs["j"], now)
    return [flight for rank in detail["rank_list"] for pg in rank["pgs"] for flight in pg["in_flight"]]


def test_the_incident_cli_counts_unconfirmed_flights() -> None:
    """An incident's heads line says how many of the flights are unconfirmed (nothing when none is)."""
    from sentinel.cli.cmd_incident import _describe

    send = {"seq": 7, "op": "nccl:send 0->1", "age_s": 2.5, "p2p": True}
    pgs = [{"last_completed_seq": 4, "in_flight": [send, send | {"unconfirmed": True}]}]
    assert _describe({"type": "heads", "data": {"rank": 0, "pgs": pgs}}) == (
        "heads rank 0 completed [4] in flight 2 (1 unconfirmed)"
    )
    pgs[0]["in_flight"] = [send]
    assert (
        _describe({"type": "heads", "data": {"rank": 0, "pgs": pgs}})
        == "heads rank 0 completed [4] in flight 1"
    )


def test_an_unconfirmed_counterpart_is_not_blamed_as_never_posted() -> None:
    """Rank 10 is blocked in its recv from rank 9, whose send to it is reported unconfirmed: it may be
    pending (a transfer that does not complete), so rank 9 is not named for never posting it; confirmed, the
    stall is judged as a posted pair (no culprit among the ranks either)."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_p2p(f, t, {}, completed=10 + int(t))
        f.engine.tick(t)
    for t in (4.0, 6.0, 8.0, 10.0, 12.0):
        ops = {10: ("nccl:recv 10<-9", t - 3.0), 9: ("nccl:send 9->10", t - 3.5)}
        _feed_p2p(f, t, ops, unconfirmed={9})
        f.engine.tick(t)
        assert _stuck(f) == []
        _feed_p2p(f, t, ops)  # the same confirmed
        f.engine.tick(t)
        assert _stuck(f) == []


def test_every_rank_blocked_in_send_recv_names_the_stage_that_never_sent() -> None:
    """No collective is stalled (nothing but the send/recv ops is in flight) and the heads stop moving: the
    wait-for graph over the peers leads every chain to rank 9. Before, no collective stall meant no verdict."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_p2p(f, t, {}, completed=10 + int(t))
        f.engine.tick(t)
    for t in (4.0, 6.0):
        _pipeline_stall(f, t, t - 3.0)
        f.engine.tick(t)
        assert _stuck(f) == []  # the recvs are younger than min_wait_s (4 s)
    for t in (8.0, 10.0):
        _pipeline_stall(f, t, t - 3.0)
        f.engine.tick(t)
    found = _stuck(f)
    assert [(r, why) for r, why, _ in found] == [(9, "not_entered_collective")], found
    evidence = found[0][2]
    assert "are blocked in send/recv and none in a stalled collective; the longest for" in evidence
    assert (
        "rank 9 never posted the send that rank" in evidence and "in no send/recv nor collective" in evidence
    )
    stall = f.engine.stalls["j"]
    assert stall.culprits == [9] and stall.pg == "world" and len(stall.waiting) == 15
    _feed_p2p(f, 12.0, {}, completed=20)  # the pipeline moves again: the verdict closes
    f.engine.tick(12.0)
    assert _stuck(f) == []


def test_ranks_that_each_send_to_the_other_are_a_p2p_deadlock() -> None:
    """Ranks 4 and 5 both block in a send to each other and neither posted the recv: a cycle."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_p2p(f, t, {}, completed=10 + int(t))
        f.engine.tick(t)
    for t in (4.0, 6.0, 8.0, 10.0):
        _feed_p2p(f, t, {4: ("nccl:send 4->5", t - 3.0), 5: ("nccl:send 5->4", t - 3.0)})
        f.engine.tick(t)
    found = _stuck(f)
    assert [(r, why) for r, why, _ in found] == [(4, "deadlock"), (5, "deadlock")], found
    assert "wait on each other in send/recv" in found[0][2]


def test_send_recv_that_both_sides_posted_is_an_inconclusive_stall_once_unexplained() -> None:
    """Rank 2 sends to rank 3, which posted the recv: both are blocked, nobody is to blame (a transfer that
    does not complete). No verdict while it could be a slow transfer; after unexplained_wait_s (120 s) one
    inconclusive p2p_stalled verdict with the blocked ops as evidence, instead of silence."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_p2p(f, t, {}, completed=10 + int(t))
        f.engine.tick(t)
    seen: list[list[tuple[int | None, str]]] = []
    for step in range(4, 132, 2):
        t = float(step)
        _feed_p2p(f, t, {2: ("nccl:send 2->3", t - 3.0), 3: ("nccl:recv 3<-2", t - 3.0)})
        f.engine.tick(t)
        seen.append([(r, why) for r, why, _ in _stuck(f)])
    assert seen[:55] == [[]] * 55  # up to 114 s of waiting: nothing said
    assert seen[-1] == [(None, "p2p_stalled")], seen[-1]
    evidence = _stuck(f)[0][2]
    assert "inconclusive: all ranks blocked in send/recv" in evidence
    assert "rank 2 in send (pg world, p2p #32) with rank 3, which posted the counterpart" in evidence
    assert f.engine.stalls["j"].waiting == [2, 3]


def test_a_p2p_stall_whose_peer_went_silent_names_the_gone_rank() -> None:
    """Rank 7 waits in a recv from rank 6, whose heads stop: rank 6 is gone."""
    f = Fleet()
    for t in (0.0, 2.0):
        _feed_p2p(f, t, {}, completed=10 + int(t))
        f.engine.tick(t)
    for t in (4.0, 6.0, 8.0, 10.0, 12.0, 14.0):
        # from 6 s on rank 6 sends no heads: they turn stale after heads_fresh_s (5 s)
        _feed_p2p(f, t, {7: ("nccl:recv 7<-6", t - 3.0)}, silent={6} if t > 4.0 else ())
        f.engine.tick(t)
        if t == 8.0:  # rank 6's last heads (4 s) are still fresh: idle, it never sent
            assert [(r, why) for r, why, _ in _stuck(f)] == [(6, "not_entered_collective")]
    found = _stuck(f)
    assert [r for r, _, _ in found] == [6] and "rank 6's process is gone or silent" in found[0][2], found
    cfg = f.engine.config.detect
    fresh, _ = run_steps(
        evaluate_job_steps(
            f.engine.fleet.jobs["j"], f.engine.fleet, cfg.stuck, cfg.hardware, 14.0, cfg.network
        )
    )
    assert [(x.rank, x.reason) for x in fresh] == [(6, "rank_gone")]


def test_a_send_recv_wait_shorter_than_two_of_the_jobs_steps_is_no_stall() -> None:
    """A pipeline stage waits in a recv through the bubble of the stages before it: in a job whose step (its
    collectives' progress) takes 4 s, stages blocked in send/recv for 6 s are no stall yet (min_wait_s is
    4 s); past two steps they are, and rank 9 is named."""
    f = Fleet()
    for step in range(0, 26, 2):  # one collective completed every 4 s: the job's step time
        t = float(step)
        _feed_p2p(f, t, {}, completed=10 + step // 4)
        f.engine.tick(t)
    step_s = f.engine.fleet.jobs["j"].step_s  # measured over >= 10 s of heads: 4-5 s
    assert step_s is not None and 3.5 < step_s <= 5.0
    t = 26.0
    while t - 25.0 < 2 * step_s:  # the recvs are younger than two steps (but older than min_wait_s)
        _pipeline_stall(f, t, t - 25.0)
        f.engine.tick(t)
        assert _stuck(f) == [], t
        t += 2.0
    assert 2 * step_s > 6.0  # so the loop above held through waits that min_wait_s (4 s) alone names
    for then in (t, t + 2.0):
        _pipeline_stall(f, then, then - 25.0)
        f.engine.tick(then)
    assert [(r, why) for r, why, _ in _stuck(f)] == [(9, "not_entered_collective")]


_p2p_name = st.one_of(
    st.builds(lambda me, peer: f"nccl:send {me}->{peer}", st.integers(-2, 17), st.integers(-2, 17)),
    st.builds(lambda me, peer: f"nccl:recv {me}<-{peer}", st.integers(-2, 17), st.integers(-2, 17)),
    st.sampled_from(
        ["nccl:send 3->", "nccl:recv <-", "gloo:recv 1<-1", "nccl:coalesced", "nccl:send 1->99999999"]
    ),
)


@st.composite
def _p2p_jobs(draw: st.DrawFn) -> tuple[dict[int, list[tuple[str, float]]], set[int], list[int] | None]:
    world = draw(st.integers(2, 16))
    ops = {
        r: draw(st.lists(st.tuples(_p2p_name, st.floats(0.0, 300.0)), max_size=3))
        for r in range(world)
        if draw(st.booleans())
    }
    silent = set(draw(st.lists(st.integers(0, world - 1), max_size=3)))
    ranks = draw(st.one_of(st.none(), st.just(list(range(world))), st.just(list(range(1, world)))))
    return ops, silent, ranks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_p2p_jobs(), st.sampled_from([6.0, 30.0, 130.0]))
def test_fuzz_heads_blocked_in_any_send_recv_give_bounded_consistent_verdicts(
    job: tuple[dict[int, list[tuple[str, float]]], set[int], list[int] | None], later: float
) -> None:
    """Heads whose ranks hold any pending send/recv (peers out of range, themselves, unparsable, in a group
    without a rank list or a shorter one), some ranks silent: the detector never fails, names only ranks
    with a reason it knows, and every rank it blames is one that a rank blocked in a send/recv for at
    least min_wait_s waits for (its peer, the group-local number mapped through the group's ranks)."""
    ops, silent, members = job
    f = Fleet(hosts=1, gpus=16)

    def feed(t: float, stalled: bool) -> None:
        out = []
        for r in range(16):
            if stalled and r in silent:
                continue
            flights = [
                InFlight(seq=30 + i, op=name, age_s=age, state="started", p2p=True)
                for i, (name, age) in enumerate(ops.get(r, []))
            ]
            head = PgHead(
                pg_name="world",
                pg_desc="default_pg",
                ranks=members,
                last_enqueued_seq=12,
                last_completed_seq=12,  # no collective progress from the first heads on
                in_flight=flights if stalled else [],
            )
            out.append(heads(r, t, [head], "h0", r))
        f.send("h0", t, heads=out)

    feed(0.0, stalled=False)
    f.engine.tick(0.0)
    feed(later, stalled=True)
    f.engine.tick(later)
    awaited = set()
    for r, pending in ops.items():
        for name, age in pending:
            peers = p2p_peer(name)
            if peers is None or age < f.engine.config.detect.stuck.min_wait_s or r in silent:
                continue
            local = peers[1] if is_send(name) else peers[0]
            if members and 0 <= local < len(members):
                awaited.add(sorted(members)[local])
            elif not members and 0 <= local < 1 << 24:  # the world group without a list: global = local
                awaited.add(local)
    known = {"not_entered_collective", "rank_gone", "deadlock", "p2p_stalled", "io_hang"}
    for v in f.engine.book.open.values():
        if v.kind != "stuck":
            continue
        assert v.reason in known, v.reason
        assert all(isinstance(e, str) and e for e in v.evidence)
        if v.reason == "p2p_stalled":
            assert v.rank is None
        else:
            assert v.rank in awaited, (v.rank, v.reason, awaited, v.evidence)
    stall = f.engine.stalls.get("j")
    if stall is not None:
        assert set(stall.waiting) <= set(ops) - silent, (stall.waiting, ops)

"""The live probe's dump policy on a running NCCL pipeline, on a virtual clock.

The flight recorders here are SYNTHETIC, in ProcessGroupNCCL's layout (tests/fr/test_live_batches.py and
tests/fr/test_live_counters.py say where each field comes from): a 2-rank job whose every step (STEP_S) is an
all_reduce and then one ``batch_isend_irecv`` batch of one op per rank (rank 0 sends to rank 1), kept in a
ring buffer of BUFFER entries. The batch member never gets times (scheduled, forever); the all_reduce and
the batch's ``nccl:coalesced`` closer complete a few ms after they are recorded. The status mixes the two
counters as NCCL does (each value the seq of the last enqueued / completed work, collective or send/recv).
The probe's three torch calls are fakes reading that recorder at the tick's time; the heads go through the
aggregator's engine on the same clock. No GPU, no NCCL.
"""

from __future__ import annotations

import math
import pickle
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from sentinel.fr.heads import FrHeads
from sentinel.probe import (
    CONFIRM_LONE_AFTER_S,
    MIXED_STILL_REFRESH_S,
    SETTLE_MIN_GAP_S,
    Probe,
)
from tests.fr.test_live_batches import T0_NS, _entry

STEP_S = 0.25
BUFFER = 400
MS = 1_000_000
PEER = {0: "send 0->1", 1: "recv 1<-0"}


@dataclass
class _Op:
    entry: dict[str, Any]
    done_ns: int | None  # when the watchdog marks it completed (None: never)
    seq: int  # the seq of its work in pg_status (collective or p2p counter); -1: no work of its own


def _pipeline(rank: int, steps: int, *, hang_at: int | None = None) -> list[_Op]:
    """Rank ``rank``'s recorded ops of ``steps`` steps from T0_NS. With ``hang_at``, step ``hang_at`` is
    where rank 1 stops for good (it never posts its recv) and rank 0 posts a lone isend (its own work)
    instead of its batch, which never completes; neither rank records anything after it."""
    ops: list[_Op] = []
    for step in range(1, steps + 1):
        t = T0_NS + int(step * STEP_S * 1e9)
        if hang_at is not None and step == hang_at:
            if rank == 0:
                lone = _entry(rank, f"nccl:{PEER[rank]}", step - 1, step, t, True)
                ops.append(_Op(lone, None, step))
            break
        coll = _entry(rank, "nccl:all_reduce", step, step - 1, t, False)
        member = _entry(rank, f"nccl:{PEER[rank]}", step, step, t + 1 * MS, True)
        closer = _entry(rank, "nccl:coalesced", step, step, t + 1 * MS + 1000, True)
        ops += [_Op(coll, t + 5 * MS, step), _Op(member, None, -1), _Op(closer, t + 4 * MS, step)]
    for n, op in enumerate(ops):
        op.entry["record_id"] = op.entry["op_id"] = n
    return ops


class _Recorder:
    """One rank's flight recorder as it stands at ``at`` (ns), and the probe's calls into it, counted."""

    def __init__(self, ops: list[_Op]) -> None:
        self.ops = ops
        self.at = T0_NS
        self.active_calls = 0
        self.every_calls = 0

    def _entries(self) -> list[dict[str, Any]]:
        recorded = [op for op in self.ops if op.entry["time_created_ns"] <= self.at][-BUFFER:]
        out = []
        for op in recorded:
            e = dict(op.entry)
            done = op.done_ns is not None and op.done_ns <= self.at
            e.update(
                retired=done,
                state="completed" if done else "scheduled",
                time_discovered_started_ns=e["time_created_ns"] + 1000 if done else None,
                time_discovered_completed_ns=op.done_ns if done else None,
                duration_ms=1.0 if done else None,
            )
            out.append(e)
        return out

    def _status(self) -> dict[str, Any]:
        works = [op for op in self.ops if op.seq >= 0 and op.entry["time_created_ns"] <= self.at]
        done = [op for op in works if op.done_ns is not None and op.done_ns <= self.at]
        enq = works[-1].seq if works else -1
        completed = max(done, key=lambda op: op.done_ns or 0).seq if done else -1
        return {
            "0": {
                "last_enqueued_collective": enq,
                "last_started_collective": -1,
                "last_completed_collective": completed,
            }
        }

    def _top(self, entries: list[dict[str, Any]]) -> bytes:
        top = {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": self._status(),
            "entries": entries,
        }
        return pickle.dumps(top, protocol=2)

    def status(self) -> bytes:
        return pickle.dumps({"pg_status": self._status()}, protocol=2)

    def active(self) -> bytes:
        self.active_calls += 1
        return self._top([e for e in self._entries() if e["time_discovered_completed_ns"] is None])

    def every(self) -> bytes:
        self.every_calls += 1
        return self._top(self._entries())


def _probe(rank: int, rec: _Recorder, *, reference: bool = False) -> Probe:
    """The probe on ``rec``. ``reference``: the probe reads every entry at every tick (what main's probe
    reduced whenever a lone op was unsettled: no op is ever unconfirmed, none capped)."""
    if reference:
        probe = Probe(2.0, "/nonexistent/probe.sock", dump_fn=rec.every, status_fn=None)
    else:
        probe = Probe(
            2.0, "/nonexistent/probe.sock", dump_fn=rec.active, all_fn=rec.every, status_fn=rec.status
        )
    probe._identity = {"rank": rank, "local_rank": rank, "world_size": 2, "job_id": "j", "pid": 1}
    return probe


@dataclass
class _Run:
    recorders: dict[int, _Recorder]
    heads: list[list[FrHeads]]  # per tick, per rank
    opened: dict[tuple[int | None, str], float]  # stuck verdicts: (rank, reason) -> first tick open
    evidence: dict[tuple[int | None, str], list[str]]
    dumps_per_tick: list[int]  # dumps with entries, both ranks together


def _run(
    ticks: list[float],
    *,
    hang_at: int | None = None,
    reference: bool = False,
    engine_every: float = 0.0,
    min_wait_s: float | None = None,
    steps: int | None = None,
    phase: float = 0.0,
) -> _Run:
    """Both ranks' probes at ``ticks`` (s after T0; rank 1's ``phase`` s later) over a job of ``steps``
    steps (default: enough to outlast them); with ``engine_every``, the engine also ticks that often
    between them (it extrapolates the heads' ages); ``min_wait_s``: the aggregator's
    ``detect.stuck.min_wait_s`` (default its default)."""
    from sentinel.aggregator.engine import Engine
    from sentinel.config.aggregator import AggregatorConfig, DetectConfig, StuckConfig
    from sentinel.wire import Batch
    from tests.aggregator.helpers import hello, sample

    if steps is None:
        steps = int((ticks[-1] + phase) / STEP_S) + 2
    recorders = {r: _Recorder(_pipeline(r, steps, hang_at=hang_at)) for r in (0, 1)}
    probes = {r: _probe(r, rec, reference=reference) for r, rec in recorders.items()}
    config = None
    if min_wait_s is not None:
        config = AggregatorConfig(detect=DetectConfig(stuck=StuckConfig(min_wait_s=min_wait_s)))
    engine = Engine(config)
    t0 = T0_NS / 1e9
    host = engine.hello(hello("h0", 2), t0)
    run = _Run(recorders, [], {}, {}, [])
    moments: dict[float, list[int]] = {}  # when -> the ranks whose probes tick then
    for tick in ticks:
        for r in (0, 1):
            moments.setdefault(tick + (phase if r else 0.0), []).append(r)
    times = sorted(moments)
    for i, tick in enumerate(times):
        t = t0 + tick
        before = sum(rec.active_calls + rec.every_calls for rec in recorders.values())
        heads = []
        for r in moments[tick]:
            recorders[r].at = T0_NS + int(tick * 1e9)
            raw = probes[r].snapshot(now=t)
            assert raw is not None
            heads.append(msgspec.structs.replace(msgspec.msgpack.decode(raw, type=FrHeads), gpu=r))
        run.heads.append(heads)
        run.dumps_per_tick.append(
            sum(rec.active_calls + rec.every_calls for rec in recorders.values()) - before
        )
        engine.ingest(host, Batch(seq=i, t=t, samples=[sample(g, t) for g in range(2)], heads=heads), t)
        later = times[i + 1] if i + 1 < len(times) else tick + 2.0
        at = tick
        while True:
            engine.tick(t0 + at)
            for v in engine.book.open.values():
                if v.kind == "stuck":
                    run.opened.setdefault((v.rank, v.reason), at)
                    run.evidence.setdefault((v.rank, v.reason), list(v.evidence))
            at += engine_every
            if engine_every <= 0 or at >= later - 1e-9:
                break
    return run


def _grid(seconds: float, jitter: list[float] | None = None) -> list[float]:
    """Ticks every 2 s from 1 s, each late by the next ``jitter`` value (cycled)."""
    n = int(seconds / 2.0)
    late = jitter or [0.0]
    return [1.0 + 2.0 * i + late[i % len(late)] for i in range(n)]


@pytest.mark.parametrize("jitter", [[0.0], [0.0, 0.004, 0.3, 0.001, 0.15], [0.2, 0.0]])
def test_a_pipeline_of_one_op_batches_takes_a_bounded_number_of_dumps(jitter: list[float]) -> None:
    """Two minutes of a running pipeline (every tick sees new one-op batches completed since the last, and
    their members left behind): at most one dump with entries per rank and tick, at most one of every entry
    per SETTLE_MIN_GAP_S, no stuck verdict, and every member left behind reported unconfirmed until a dump
    of every entry settles it. Main took both dumps at every tick (120 s: 60 + 60 per rank)."""
    ticks = _grid(120.0, jitter)
    run = _run(ticks)
    assert run.opened == {}
    assert max(run.dumps_per_tick) <= 2  # two ranks, one dump each
    span = ticks[-1] - ticks[0]
    for rec in run.recorders.values():
        assert rec.every_calls <= 1 + math.floor(span / SETTLE_MIN_GAP_S), rec.every_calls
        assert rec.every_calls + rec.active_calls <= len(ticks)
    if jitter == [0.0]:  # on time: every other tick
        assert [rec.every_calls for rec in run.recorders.values()] == [len(ticks) // 2] * 2
    for heads in run.heads:
        for h in heads:
            for pg in h.pgs:
                for f in pg.in_flight:
                    assert not f.p2p or f.unconfirmed or f.age_s < CONFIRM_LONE_AFTER_S, (h.rank, f)
                # the all_reduce of each step is seen: the group's collectives read where they are
                assert pg.last_completed_seq >= int((h.t - T0_NS / 1e9) / STEP_S) - 9


@pytest.mark.parametrize("jitter", [[0.0], [0.0, 0.004, 0.3, 0.001, 0.15]])
@pytest.mark.parametrize("hang_tick", [0.01, 0.2, 0.26, 1.0, 1.99, 2.0, 2.2, 3.0])
def test_a_really_stuck_send_is_named_at_the_same_time_with_the_same_details(
    hang_tick: float, jitter: list[float]
) -> None:
    """The pipeline runs 20 s, then rank 1 stops for good and rank 0's next op is a lone isend (its own
    work) never received, posted ``hang_tick`` s after a tick (just after a dump of every entry or not;
    ticks on time or late). The engine ticks every 0.25 s in between (it extrapolates ages). The stuck
    verdict opens at the same moment with the same evidence as with a probe reading every entry at every
    tick, while the pipeline ran on the bounded dumps (main: two dumps per rank and tick). With ticks late,
    at 2.0-2.2 s, kept heads of an idle-looking group once showed its completed all_reduce #92 waiting
    (completed #92 after closing send #92 leaves the status as it was) and the verdict came 3.6 s late."""
    hang_step = int((21.0 + hang_tick) / STEP_S) + 1  # the first step after 21 s + hang_tick
    ticks = _grid(60.0, jitter)
    ref = _run(ticks, hang_at=hang_step, reference=True, engine_every=0.25)
    run = _run(ticks, hang_at=hang_step, engine_every=0.25)
    assert list(ref.opened) == [(1, "not_entered_collective")], ref.opened
    assert run.opened == ref.opened
    assert run.evidence == ref.evidence
    assert any("send" in line for line in run.evidence[(1, "not_entered_collective")])
    before_hang = [n for n, t in zip(run.dumps_per_tick, ticks, strict=True) if t < 20.0]
    assert max(before_hang) <= 2
    every = run.recorders[0].every_calls
    assert every <= 1 + math.floor((ticks[-1] - ticks[0]) / SETTLE_MIN_GAP_S)


@pytest.mark.parametrize("min_wait_s", [2.0, 1.0])
@pytest.mark.parametrize("phase", [0.0, 0.3, 1.0, 1.7])
@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("jitter", [[0.0], [0.0, 0.004, 0.3, 0.001, 0.15]])
def test_completed_one_op_batches_are_named_stuck_at_no_min_wait(
    min_wait_s: float, phase: float, paused: bool, jitter: list[float]
) -> None:
    """A site that sets ``detect.stuck.min_wait_s`` below the default: the pipeline of one-op batches runs
    60 s (or pauses for a checkpoint at 20 s), rank 1's probe ticking ``phase`` s after rank 0's, the
    engine every 0.25 s. The members left behind are reported at their age, unconfirmed, and the detector
    counts none: no stuck verdict. Main capped them to 1.9 s for the default 4 s, so the detector with
    2 s (own report >= 1 s) or 1 s counted them: rank 0's unsettled send whose counterpart rank 1 had
    settled named rank 1 (or 0) ``not_entered_collective``, at 1 s also while the pipeline ran."""
    ticks = _grid(60.0, jitter)
    run = _run(ticks, engine_every=0.25, min_wait_s=min_wait_s, phase=phase, steps=80 if paused else None)
    assert run.opened == {}
    marked = [f for heads in run.heads for h in heads for pg in h.pgs for f in pg.in_flight if f.unconfirmed]
    assert marked  # (the members were there, reported unconfirmed)
    assert max(f.age_s for f in marked) > 1.9  # at their age: main capped them to 1.9 s


@pytest.mark.parametrize("min_wait_s", [2.0, 1.0])
@pytest.mark.parametrize("phase", [0.0, 1.0])
@pytest.mark.parametrize("jitter", [[0.0], [0.0, 0.004, 0.3, 0.001, 0.15]])
@pytest.mark.parametrize("hang_tick", [0.01, 1.0, 1.99, 2.2])
def test_a_really_stuck_send_is_named_at_a_lower_min_wait_within_a_settle_gap(
    min_wait_s: float, phase: float, jitter: list[float], hang_tick: float
) -> None:
    """The stuck send of the test above with ``detect.stuck.min_wait_s`` below the default and rank 1's
    probe ``phase`` s behind: it is named (rank 1, with the same evidence as by a probe that reads every
    entry at every tick), at most SETTLE_MIN_GAP_S later than by that probe (its wait counts only once a
    dump of every entry confirmed it), and never later than at the default config."""
    hang_step = int((21.0 + hang_tick) / STEP_S) + 1
    ticks = _grid(60.0, jitter)
    kw: dict[str, Any] = {"hang_at": hang_step, "engine_every": 0.25, "phase": phase}
    ref = _run(ticks, reference=True, min_wait_s=min_wait_s, **kw)
    run = _run(ticks, min_wait_s=min_wait_s, **kw)
    default = _run(ticks, **kw)
    key = (1, "not_entered_collective")
    assert list(ref.opened) == list(run.opened) == list(default.opened) == [key], (ref.opened, run.opened)
    assert ref.opened[key] <= run.opened[key] <= ref.opened[key] + SETTLE_MIN_GAP_S
    assert run.opened[key] <= default.opened[key]

    def text(lines: list[str]) -> list[str]:  # (the lines say how long it had waited when it opened)
        return [re.sub(r"\d+\.\ds", "_s", line) for line in lines]

    assert text(run.evidence[key]) == text(ref.evidence[key])


def test_a_mixed_group_standing_still_takes_no_dump_per_tick_after_the_first() -> None:
    """The pipeline stops (a checkpoint) at 10 s with nothing pending: each rank's status stands still.
    Once a dump shows it idle (its one-op batches settled), the probe keeps those heads and reads the status
    alone, one dump per MIXED_STILL_REFRESH_S; the heads say what a dump would (nothing waits). Main: a dump
    of the active entries at every tick."""
    steps_until = int(10.0 / STEP_S)
    ticks = _grid(120.0)
    recorders = {r: _Recorder(_pipeline(r, steps_until)) for r in (0, 1)}
    probes = {r: _probe(r, rec) for r, rec in recorders.items()}
    still_from = next(i for i, t in enumerate(ticks) if t > 10.0 + 0.01)
    dumps_at: list[int] = []
    for i, tick in enumerate(ticks):
        before = recorders[0].active_calls + recorders[0].every_calls
        for r, probe in probes.items():
            recorders[r].at = T0_NS + int(tick * 1e9)
            raw = probe.snapshot(now=T0_NS / 1e9 + tick)
            assert raw is not None
            heads = msgspec.msgpack.decode(raw, type=FrHeads)
            [pg] = heads.pgs
            if i >= still_from:
                assert (pg.last_enqueued_seq, pg.last_completed_seq) == (steps_until, steps_until)
                assert all(f.unconfirmed for f in pg.in_flight if f.p2p)
        if recorders[0].active_calls + recorders[0].every_calls > before:
            dumps_at.append(i)
    still = [i for i in dumps_at if i > still_from]
    span = ticks[-1] - ticks[still_from]
    assert len(still) <= 1 + span / MIXED_STILL_REFRESH_S, dumps_at
    assert len(still) < (len(ticks) - still_from) / 4


def test_without_a_dump_of_every_entry_nothing_is_unconfirmed() -> None:
    """A probe that can take no dump of every entry (none given, not torch's) cannot settle lone ops: it
    reports them at their age and confirmed, as before the policy, rather than hide a really pending one
    from the detector for good."""
    rec = _Recorder(_pipeline(0, 30, hang_at=20))  # the lone send at 5 s, behind 19 unsettled members
    probe = Probe(2.0, "/nonexistent/probe.sock", dump_fn=rec.active, status_fn=rec.status)
    probe._identity = {"rank": 0, "local_rank": 0, "world_size": 2, "job_id": "j", "pid": 1}
    ages = []
    for tick in (5.5, 7.5, 9.5):
        rec.at = T0_NS + int(tick * 1e9)
        raw = probe.snapshot(now=T0_NS / 1e9 + tick)
        assert raw is not None
        [pg] = msgspec.msgpack.decode(raw, type=FrHeads).pgs
        ages += [round(f.age_s, 3) for f in pg.in_flight if f.p2p and f.seq == 20]
        assert not any(f.unconfirmed for f in pg.in_flight)
    assert ages == [0.5, 2.5, 4.5]
    assert rec.every_calls == 0

"""The detectors' incremental paths reach what a full recomputation reaches.

The stuck detector keeps a stalled job's examination while its heads do not move (and re-examines only when
they do, or when time alone can change the answer); the inventory detector keeps each host's facts until its
inventory changes. Hypothesis drives random change sequences through the fleet state and compares, tick by
tick, the long-lived detector with a fresh one that has nothing cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sentinel.aggregator import state
from sentinel.aggregator.detectors.base import Observation, run_steps
from sentinel.aggregator.detectors.inventory import InventoryDetector
from sentinel.aggregator.detectors.stuck import StuckDetector
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.verdicts import Finding
from sentinel.components.pcie.record import PcieLink
from sentinel.config.aggregator import AggregatorConfig
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.wire import Batch, GpuInfo, Hello, ProcInfo
from tests.aggregator.helpers import sample

HOSTS = 2
GPUS = 4
RANKS = HOSTS * GPUS
JOB = "j"


@dataclass
class Rank:
    completed: int = 10
    #: the collective it waits in: (group, when it entered) or None
    waiting: tuple[str, float] | None = None
    sending: bool = True
    alive: bool = True
    blocked: bool = False


def _groups(rank: int) -> list[tuple[str, str, list[int] | None]]:
    host = rank // GPUS
    return [("world", "default_pg", None), (f"tp{host}", "tp", list(range(host * GPUS, (host + 1) * GPUS)))]


def _heads(rank: int, r: Rank, t: float) -> FrHeads:
    pgs = []
    for name, desc, members in _groups(rank):
        waits = r.waiting is not None and r.waiting[0] == name
        flight = (
            [InFlight(seq=r.completed + 1, op="allreduce", age_s=t - r.waiting[1], state="started")]
            if (waits and r.waiting is not None)
            else []
        )
        pgs.append(
            PgHead(
                pg_name=name,
                pg_desc=desc,
                ranks=members,
                last_enqueued_seq=r.completed + (1 if waits else 0),
                last_started_seq=r.completed + (1 if waits else 0),
                last_completed_seq=r.completed,
                in_flight=flight,
            )
        )
    return FrHeads(rank=rank, t=t, job_id=JOB, world_size=RANKS, gpu=rank % GPUS, pgs=pgs)


# one change to one rank at one tick
change = st.tuples(
    st.integers(0, RANKS - 1),
    st.sampled_from(["progress", "enter_world", "enter_tp", "silent", "resume", "exit", "start", "block"]),
)
ticks = st.lists(st.lists(change, max_size=3), min_size=8, max_size=40)


def _key(f: Finding) -> tuple[str, ...]:
    return f.key


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ticks)
def test_a_kept_examination_finds_what_a_fresh_examination_finds(
    changes: list[list[tuple[int, str]]],
) -> None:
    """Random heads, silences, exits and I/O hangs, ticked once a second: the stuck detector that keeps its
    examinations gives exactly the findings (culprits, reasons, actions, evidence) of one examining afresh."""
    engine = Engine()
    views = {}
    for h in range(HOSTS):
        gpus = [
            GpuInfo(index=g, uuid=f"GPU-{h}-{g}", pci_bus=f"0000:{g:02x}:00", name="H100")
            for g in range(GPUS)
        ]
        views[h] = engine.fleet.hello(Hello(host=f"h{h}", boot_id="b", gpus=gpus), 0.0)
    ranks = [Rank() for _ in range(RANKS)]
    kept = StuckDetector(AggregatorConfig())
    seq = [0] * HOSTS
    examined_with_stall = 0
    for tick, todo in enumerate(changes):
        t = float(tick)
        procs_changed = tick == 0
        for rank, what in todo:
            r = ranks[rank]
            if what == "progress":
                r.completed += 1
                r.waiting = None
            elif what in ("enter_world", "enter_tp") and r.waiting is None:
                r.waiting = ("world" if what == "enter_world" else f"tp{rank // GPUS}", t - 0.25)
            elif what == "silent":
                r.sending = False
            elif what == "resume":
                r.sending = True
            elif what in ("exit", "start"):
                r.alive = what == "start"
                procs_changed = True
            elif what == "block":
                r.blocked = not r.blocked
                procs_changed = True
        for h in range(HOSTS):
            mine = range(h * GPUS, (h + 1) * GPUS)
            procs = (
                [
                    ProcInfo(
                        gpu=i % GPUS,
                        pid=100 + i,
                        job_id=JOB,
                        rank=i,
                        world_size=RANKS,
                        blocked_io=ranks[i].blocked,
                    )
                    for i in mine
                    if ranks[i].alive
                ]
                if procs_changed
                else None
            )
            heads = [_heads(i, ranks[i], t) for i in mine if ranks[i].sending and ranks[i].alive]
            samples = [
                sample(g, t, util_gpu_pct=10.0 if (h * GPUS + g) % 3 == 0 else 95.0) for g in range(GPUS)
            ]
            engine.fleet.apply(views[h], Batch(seq=seq[h], t=t, samples=samples, heads=heads, procs=procs), t)
            seq[h] += 1
        seen = Observation(engine.fleet, t)
        got = sorted(kept.evaluate(seen).findings, key=_key)
        fresh = sorted(StuckDetector(AggregatorConfig()).evaluate(seen).findings, key=_key)
        assert got == fresh, tick
        examined_with_stall += bool(got)
    event("stalled" if examined_with_stall else "never stalled")  # about half the examples stall


def test_a_kept_examination_is_used_while_the_heads_only_repeat() -> None:
    """A stalled job whose ranks resend the same waits is examined once, not every tick; a rank that moves
    makes it examined again."""
    from sentinel.aggregator.detectors import stuck

    engine = Engine()
    gpus = [GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{g:02x}:00", name="H100") for g in range(GPUS)]
    view = engine.fleet.hello(Hello(host="h0", boot_id="b", gpus=gpus), 0.0)
    ranks = [Rank() for _ in range(GPUS)]
    calls: list[float] = []
    real = stuck.examine_steps

    def counted(*args: object) -> object:
        calls.append(args[2])  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    detector = StuckDetector(AggregatorConfig())
    stuck.examine_steps = counted  # type: ignore[assignment]
    try:
        for tick in range(20):
            t = float(tick)
            if tick == 2:
                for i in (0, 1, 2):
                    ranks[i].waiting = ("tp0", t - 0.25)  # rank 3 never enters
            if tick == 15:
                ranks[3].waiting = ("world", t - 0.25)  # rank 3 moves (into another group)
            heads = [_heads(i, ranks[i], t) for i in range(GPUS)]
            engine.fleet.apply(view, Batch(seq=tick, t=t, heads=heads), t)
            findings = detector.evaluate(Observation(engine.fleet, t)).findings
            if 8 <= tick < 15:
                assert [f.rank for f in findings] == [3]
    finally:
        stuck.examine_steps = real
    stalled = [t for t in calls if 8.0 <= t < 15.0]
    assert len(stalled) <= 1, calls
    assert 15.0 in calls


inventory_change = st.tuples(
    st.integers(0, 5),
    st.sampled_from(["vbios", "driver", "model", "pcie", "hello", "forget"]),
    st.integers(0, 2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(inventory_change, max_size=4), min_size=3, max_size=25))
def test_kept_host_facts_give_the_findings_of_facts_rebuilt(
    changes: list[list[tuple[int, str, int]]],
) -> None:
    """Random inventory changes (firmware, model, PCIe link capability, new hellos, forgotten hosts): the
    inventory detector that keeps each host's facts finds what one rebuilding them all finds."""
    engine = Engine()
    fleet = engine.fleet
    kept = InventoryDetector(AggregatorConfig())
    vbios = {h: ["96.00"] * GPUS for h in range(6)}
    model = {h: ["H100"] * GPUS for h in range(6)}
    seq = dict.fromkeys(range(6), 0)
    present: set[int] = set()

    def say_hello(h: int, t: float) -> None:
        gpus = [
            GpuInfo(
                index=g, uuid=f"GPU-{h}-{g}", pci_bus=f"0000:{g:02x}:00", name=model[h][g], vbios=vbios[h][g]
            )
            for g in range(GPUS)
        ]
        fleet.hello(Hello(host=f"h{h}", boot_id="b", gpus=gpus), t)
        present.add(h)

    for h in range(4):
        say_hello(h, 0.0)
    for tick, todo in enumerate(changes):
        t = float(tick * 10)
        for h, what, value in todo:
            if what == "forget":
                fleet.forget_host(f"h{h}")
                kept.host_forgotten(f"h{h}")
                present.discard(h)
                continue
            if what == "vbios":
                vbios[h][value] = f"96.0{value}"
            elif what == "model":
                model[h][value] = "H100" if value == 0 else "A100"
            elif what == "pcie" and h in present:
                link = PcieLink(gen=4, width=16, gen_max=5 - (value == 1), width_max=16 >> (value == 2))
                view = fleet.hosts[f"h{h}"]
                fleet.apply(view, Batch(seq=seq[h], t=t, samples=[sample(value, t, pcie_link=link)]), t)
                seq[h] += 1
                continue
            say_hello(h, t)
        seen = Observation(fleet, t)
        got = kept.evaluate(seen)
        fresh = InventoryDetector(AggregatorConfig()).evaluate(seen)
        assert got is not None and fresh is not None

        def strip(fs: list[Finding]) -> list[tuple[Any, ...]]:
            return sorted((f.key, f.kind, f.reason, f.action, f.evidence, f.host, f.gpu) for f in fs)

        assert strip(got.findings) == strip(fresh.findings), tick


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, RANKS - 1), st.integers(0, 3)), max_size=2 * RANKS),
        min_size=1,
        max_size=30,
    )
)
def test_folding_only_the_ranks_whose_heads_came_gives_the_histories_of_walking_every_rank(
    ticks: list[list[tuple[int, int]]],
) -> None:
    """The straggler detector folds the steps of the ranks in the job's heads log since it last looked; one
    that walks every rank of the job each time must end with the same histories, tick after tick (ranks
    heard several times, not at all, or so often that the log was trimmed in between)."""
    with patch.object(state, "HEADS_LOG_SLACK", 0):  # trimmed beyond twice the ranks: exercised here
        _fold_and_compare(ticks)


def _fold_and_compare(ticks: list[list[tuple[int, int]]]) -> None:
    from sentinel.aggregator.detectors.straggler import StragglerDetector
    from sentinel.aggregator.state import FleetState
    from sentinel.fr.heads import StepTime

    fleet = FleetState()
    gpus = [GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{g:02x}:00", name="H100") for g in range(GPUS)]
    view = fleet.hello(Hello(host="h0", boot_id="b", gpus=gpus), 0.0)
    config = AggregatorConfig()
    cfg = config.detect.straggler
    kept, walking = StragglerDetector(config), StragglerDetector(config)
    completed = [0] * RANKS
    seq = 0
    for tick, arrivals in enumerate(ticks):
        t = float(tick)
        for rank, steps in arrivals:  # one batch per arrival: a rank may be heard several times a tick
            first = completed[rank]
            completed[rank] += steps
            heads = FrHeads(
                rank=rank,
                t=t,
                job_id=JOB,
                world_size=RANKS,
                gpu=rank % GPUS,
                pgs=[PgHead(pg_name="0", pg_desc="default_pg", last_completed_seq=completed[rank])],
                steps=[
                    StepTime(seq=k, compute_s=0.8 + 0.01 * rank + 0.001 * k)
                    for k in range(first, completed[rank])
                ],
            )
            fleet.apply(view, Batch(seq=seq, t=t, heads=[heads]), t + 0.001 * seq)
            seq += 1
        job = fleet.jobs.get(JOB)
        if job is None:
            continue
        run_steps(kept._measure(job, cfg))
        walking.heads_versions.clear()  # as if it had never looked: every rank is walked
        run_steps(walking._measure(job, cfg))
        got = {r: (s.last_seq, list(s.compute)) for r, s in kept.steps[JOB].items()}
        want = {r: (s.last_seq, list(s.compute)) for r, s in walking.steps[JOB].items()}
        assert got == want, tick

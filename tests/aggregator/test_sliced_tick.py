"""A tick in steps (Engine.tick_stages, Detector.evaluate_steps): a 24,576-rank-scale job's examination and
comparison are split into many short steps, batches applied between them (as the server does) open their
hardware verdicts at once, and the job's verdict is the one an unsliced run reaches."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from pathlib import Path

import msgspec
from prometheus_client import generate_latest

from sentinel.aggregator.detectors.base import ITEMS_PER_STEP, Observation
from sentinel.aggregator.detectors.link_pace import LinkPaceDetector
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.server import Aggregator
from sentinel.aggregator.state import HostView
from sentinel.aggregator.store import BuiltinsHolder
from sentinel.aggregator.tick_loop import NO_FULL_COLLECTIONS, YOUNG_COLLECTION_THRESHOLD
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig, DetectConfig, FleetConfig, IncidentsConfig
from sentinel.fr.heads import FrHeads, InFlight, PgHead, StepTime
from sentinel.wire import Batch, GpuInfo, Hello, ProcInfo, XidOccurred
from tests.aggregator.helpers import batch, hello, running_aggregator, sample, straggler_of, wait_until

GPUS = 8
RANKS = 2 * ITEMS_PER_STEP + 8 * 13  # more ranks than two steps' worth
HUNG = RANKS // 2 + 3
JOB = "big"


def _heads(rank: int, t: float, stalled_since: float | None) -> FrHeads:
    """Rank ``rank`` at ``t``: 10 steps done; from ``stalled_since`` every rank but HUNG waits in seq 11."""
    waiting = stalled_since is not None and rank != HUNG
    flight = (
        [InFlight(seq=11, op="allreduce", age_s=t - stalled_since, state="started")]
        if stalled_since is not None and waiting
        else []
    )
    assert stalled_since is None or t >= stalled_since
    return FrHeads(
        rank=rank,
        t=t,
        job_id=JOB,
        world_size=RANKS,
        gpu=rank % GPUS,
        pgs=[
            PgHead(
                pg_name="0",
                pg_desc="default_pg",
                last_enqueued_seq=10 + (1 if waiting else 0),
                last_started_seq=10 + (1 if waiting else 0),
                last_completed_seq=10,
                in_flight=flight,
            )
        ],
        steps=[StepTime(seq=s, compute_s=0.8) for s in range(3, 11)],
    )


def _fleet(engine: Engine) -> list[HostView]:
    views = []
    for h in range(RANKS // GPUS):
        gpus = [
            GpuInfo(index=g, uuid=f"GPU-{h}-{g}", pci_bus=f"0000:{g:02x}:00", name="H100")
            for g in range(GPUS)
        ]
        views.append(engine.hello(Hello(host=f"h{h:05d}", boot_id="b", gpus=gpus), 0.0))
    return views


def _feed(engine: Engine, views: list[HostView], seq: int, t: float, stalled_since: float | None) -> None:
    for h, view in enumerate(views):
        procs = (
            [
                ProcInfo(
                    gpu=g,
                    pid=1000 + h * GPUS + g,
                    job_id=JOB,
                    rank=h * GPUS + g,
                    local_rank=g,
                    world_size=RANKS,
                )
                for g in range(GPUS)
            ]
            if seq == 0
            else None
        )
        heads = [_heads(h * GPUS + g, t, stalled_since) for g in range(GPUS)]
        batch = Batch(seq=seq, t=t, samples=[sample(g, t) for g in range(GPUS)], heads=heads, procs=procs)
        engine.ingest(view, batch, t)


def test_a_large_stall_is_examined_in_many_steps_with_ingest_between_them() -> None:
    sliced, whole = Engine(), Engine()
    sliced_views, whole_views = _fleet(sliced), _fleet(whole)
    most_steps = 0
    xid_hosts: list[str] = []
    for second in range(12):
        t = float(second)
        stalled_since = 4.0 if t >= 4.0 else None
        _feed(sliced, sliced_views, second, t, stalled_since)
        _feed(whole, whole_views, second, t, stalled_since)
        whole.tick(t + 0.5)
        steps = 0
        for _ in sliced.tick_stages(t + 0.5):
            steps += 1
            # as the server: batches are applied between two steps; a hardware fault opens its verdict then
            host = sliced_views[(second * 37 + steps) % len(sliced_views)]
            if steps == 3 and second >= 8:
                xid = XidOccurred(
                    t=t + 0.5, gpu=1, text="NVRM: Xid 79", record=xid_record(79, "NVRM: Xid 79")
                )
                sliced.ingest(host, Batch(seq=1000 + second, t=t + 0.5, events=[xid]), t + 0.5)
                assert any(
                    v.host == host.name and v.gpu == 1 and v.reason == "xid_79"
                    for v in sliced.book.open.values()
                ), "the hardware verdict opens at ingest, between the tick's steps"
                xid_hosts.append(host.name)
        most_steps = max(most_steps, steps)
    # six detectors and the retention step, one step each when nothing is sliced; the stalled job's
    # first examination (four passes over 8,296 ranks and the wait-for graph) adds at least eight yields
    assert most_steps >= 1 + 6 + 8, most_steps
    stuck_sliced = {(v.job, v.rank, v.reason) for v in sliced.book.open.values() if v.kind == "stuck"}
    stuck_whole = {(v.job, v.rank, v.reason) for v in whole.book.open.values() if v.kind == "stuck"}
    assert stuck_sliced == stuck_whole and (JOB, HUNG) in {(j, r) for j, r, _ in stuck_whole}
    assert len(xid_hosts) == 4


async def test_automatic_full_collections_are_off_while_the_aggregator_runs(tmp_path: Path) -> None:
    """A full collection over the heads of two big jobs paused the loop ~0.3 s every few seconds; while the
    tick loop runs only the maintenance's own (fleet.gc_full_interval_s) happen, young ones are less
    frequent, and the thresholds come back after."""
    before = gc.get_threshold()
    async with running_aggregator(tmp_path) as running:
        await wait_until(lambda: gc.get_threshold()[2] == NO_FULL_COLLECTIONS)
        young, middle, _ = gc.get_threshold()
        assert young == max(before[0], YOUNG_COLLECTION_THRESHOLD) > 700 and middle == before[1]
        assert running.aggregator.config.fleet.gc_full_interval_s > 0
    assert gc.get_threshold() == before
    config = AggregatorConfig(fleet=FleetConfig(gc_full_interval_s=0))  # no maintenance: CPython's own
    async with running_aggregator(tmp_path, config) as running:
        await asyncio.sleep(0.05)  # the tick loop has started (it does so at start-up)
        assert running.aggregator.ticks._ticker is not None and gc.get_threshold() == before


async def test_metrics_rendered_family_by_family_are_the_registrys_exposition(tmp_path: Path) -> None:
    """/metrics resumes the loop between families (18,000 per-host series at 6,144 hosts held it up to
    0.4 s); what it serves is exactly generate_latest's rendering of the same state. (No incident is
    recorded: its writer thread would count it between the two renderings.)"""
    config = AggregatorConfig(incidents=IncidentsConfig(enabled=False))
    aggregator = Aggregator(config, tokens=["t" * 20 + " h*"], state_dir=tmp_path)
    engine = aggregator.engine
    views = [engine.hello(hello(f"h{i}"), 100.0) for i in range(5)]
    xid = XidOccurred(t=101.0, gpu=2, text="NVRM: Xid 79", record=xid_record(79, "NVRM: Xid 79"))
    for seq, view in enumerate(views):
        engine.ingest(view, batch(seq, 101.0, events=[xid] if seq == 3 else None), 101.0)
    engine.tick(102.0)
    response = await aggregator.rest.metrics_endpoint(None)  # type: ignore[arg-type]
    assert response.body == generate_latest(aggregator.metrics.registry)
    assert b"sentinel_verdict_open{" in response.body and b'host="h3"' in response.body


def test_detector_memory_is_prepared_in_steps_and_snapshots_the_same_bytes() -> None:
    """The straggler's histories of 49,152 ranks took 0.16-0.4 s to copy in one piece at each memory
    flush; prepared in steps ahead of the flush they encode to the bytes the one-piece copy gives."""
    engine = Engine()
    views = _fleet(engine)
    for second in range(3):
        _feed(engine, views, second, float(second), None)
        engine.tick(second + 0.5)
    straggler = straggler_of(engine)
    assert sum(len(r) for r in straggler.steps.values()) > ITEMS_PER_STEP
    steps = straggler.memory_steps()
    yields = 0
    try:
        while True:
            next(steps)
            yields += 1
    except StopIteration as done:
        stepped = done.value
    assert yields >= 2
    assert msgspec.msgpack.encode(stepped) == msgspec.msgpack.encode(straggler.memory())
    clock = [0.0]
    one_piece = BuiltinsHolder("detectors", dict(engine.detectors), clock=lambda: clock[0])
    prepared = BuiltinsHolder("detectors", dict(engine.detectors), clock=lambda: clock[0])
    assert sum(1 for _ in prepared.prepare()) > yields  # a yield per member too
    assert prepared.snapshot() == one_piece.snapshot() != {}
    clock[0] = 5.0  # within min_interval_s: neither is due again
    assert list(prepared.prepare()) == [] and prepared.snapshot() == {} == one_piece.snapshot()


def _stalled_engine(config: AggregatorConfig | None = None) -> Engine:
    """An engine whose big job has been stalled long enough for the stuck detector, never evaluated yet (so
    its next run is a first, sliced examination)."""
    engine = Engine(config or AggregatorConfig())
    views = _fleet(engine)
    for seq, second in enumerate((0, 4, 11)):  # steps done, then a stall of 7 s
        _feed(engine, views, seq, float(second), 4.0 if second >= 4 else None)
    return engine


def _stuck_run(engine: Engine, between: Callable[[], object]) -> int:
    """One run of the stuck detector in steps (as the tick runs it), ``between`` called after its first step."""
    run = engine._run_steps(engine.detectors["stuck"], Observation(engine.fleet, 11.5, (), tick=True))
    next(run)
    between()
    return 1 + sum(1 for _ in run)


def test_a_reload_that_switches_a_detector_off_between_its_steps_leaves_none_of_its_verdicts_open() -> None:
    """The reload closes the detector's verdicts at once; had its suspended run reconciled afterwards, they
    would open again with nothing left to close them (the detector no longer runs)."""
    control = _stalled_engine()
    assert _stuck_run(control, lambda: None) > 2  # a sliced first examination...
    assert any(v.detector == "stuck" and v.rank == HUNG for v in control.book.open.values())  # ...that opens
    engine = _stalled_engine()
    off = AggregatorConfig(detect=DetectConfig(disabled=["stuck"]))
    _stuck_run(engine, lambda: engine.reconfigure(off, 11.5))
    assert not [v for v in engine.book.open.values() if v.detector == "stuck"]


def test_findings_about_a_host_forgotten_between_a_detectors_steps_open_no_verdict() -> None:
    hung_host = f"h{HUNG // GPUS:05d}"
    control = _stalled_engine()
    _stuck_run(control, lambda: None)
    assert any(v.host == hung_host for v in control.book.open.values())
    engine = _stalled_engine()
    _stuck_run(engine, lambda: engine.forget_host(hung_host, 11.5))
    assert hung_host not in engine.fleet.hosts
    assert not [v for v in engine.book.open.values() if v.host == hung_host]
    assert engine._forgotten_in_run is None  # only hosts forgotten during a run are dropped from its findings


def test_the_link_pace_pass_over_a_large_jobs_ranks_is_sliced() -> None:
    """Its evaluation walks every rank of every job (the hosts they run on, their compute per step, the
    links serving them): a job of more than two steps' worth of ranks yields between them, and the sliced
    run finds what the run in one piece finds."""
    sliced, whole = Engine(), Engine()
    sliced_views, whole_views = _fleet(sliced), _fleet(whole)
    for second in range(3):
        _feed(sliced, sliced_views, second, float(second), None)
        _feed(whole, whole_views, second, float(second), None)
    steps = sliced.detectors["link_pace"].evaluate_steps(Observation(sliced.fleet, 3.0, (), tick=True))
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            sliced_found = done.value
            break
        yields += 1
    whole_found = whole.detectors["link_pace"].evaluate(Observation(whole.fleet, 3.0, (), tick=True))
    assert yields >= RANKS // ITEMS_PER_STEP, yields
    assert sliced_found is not None and whole_found is not None
    assert sliced_found.findings == whole_found.findings
    sliced_pace, whole_pace = sliced.detectors["link_pace"], whole.detectors["link_pace"]
    assert isinstance(sliced_pace, LinkPaceDetector) and isinstance(whole_pace, LinkPaceDetector)
    assert sliced_pace.job_hosts == whole_pace.job_hosts
    assert len(sliced_pace.job_hosts) == RANKS // GPUS

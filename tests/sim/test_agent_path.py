"""``sentinel sim`` runs the real agent: what reaches the engine was made by the agent's own collectors from
the simulated host's OS boundaries (kmsg records, NCCL debug files, the process table, probe datagrams).

Each check names a piece of the agent that only the real path has: the Xid NVML/kernel merge (one event with
the kernel line's detail), the line classifier and the pid → GPU lookup for an NCCL line, the job mapping from
each rank's environment, the heads filled with host and GPU from that mapping, a hung NVML call reported
unresponsive at the deadline by the inline worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import msgspec
import pytest

from sentinel.agent.agent import Agent
from sentinel.agent.worker import CallBlocks, InlineWorker, Unresponsive
from sentinel.aggregator.engine import Engine
from sentinel.sim.host import SimCluster, simulated_agent_config
from sentinel.sim.runner import RING_WINDOW_S, VirtualClock, simulated_agents
from sentinel.sim.scenario import load_scenario_text
from sentinel.wire import Batch, Event, GpuStateChanged, LogLine, XidOccurred
from tests.support import sent

SCENARIO = """
seed = 5
duration_s = 60
[cluster]
hosts = 2
gpus_per_host = 4
[[jobs]]
id = "train"
[[faults]]
at_s = 3.0
host = "host-001"
gpu = 1
kind = "xid"
xid = 79
[[faults]]
at_s = 3.0
host = "host-001"
gpu = 2
kind = "nccl_net_error"
[[faults]]
at_s = 3.0
host = "host-000"
gpu = 3
kind = "nvml_hang"
"""


def _run(until: float) -> dict[str, list[Batch]]:
    clock = VirtualClock()
    sim, agents = simulated_agents(load_scenario_text(SCENARIO), clock)
    batches: dict[str, list[Batch]] = {a.host: [] for a in agents}
    t = 0.0
    while t <= until:
        clock.t = t
        sim.advance(t)
        for agent in agents:
            batches[agent.host].append(sent(agent.step_inline(t)))
        t += 1.0
    return batches


def _events(batches: list[Batch]) -> list[Event]:
    return [e for b in batches for e in b.events]


def test_an_xid_reported_by_nvml_and_the_kernel_log_is_merged_by_the_agent() -> None:
    batches = _run(6.0)["host-001"]
    xids = [e for e in _events(batches) if isinstance(e, XidOccurred) and e.record.xid == 79]
    assert len(xids) == 1, xids  # NVML's event and the kmsg record are one event
    (xid,) = xids
    assert xid.gpu == 1 and xid.t == 3.0 and xid.merged is True
    assert xid.text.startswith("NVRM: Xid (PCI:") and xid.record.pid  # the kernel line's detail
    lost = [e for e in _events(batches) if isinstance(e, GpuStateChanged) and e.state == "lost"]
    assert [e.gpu for e in lost] == [1]


def test_xid_79_arriving_after_the_lost_state_still_names_the_verdict() -> None:
    """A host whose kernel log the agent cannot read (a container without CAP_SYSLOG): the agent holds NVML's
    Xid 79 for its kernel twin (xid_merge_wait_s) and sends it alone two batches after the lost state. The
    engine fed by the real agent still opens one verdict, named by the Xid."""
    clock = VirtualClock()
    scenario = load_scenario_text(SCENARIO)
    sim = SimCluster(scenario, started_at=0.0, clock=clock, inline=True)
    host = sim.hosts[1]
    config = simulated_agent_config(host.name, tick_s=scenario.tick_s, ring_window_s=RING_WINDOW_S)
    agent = Agent(config, host, replace(host.inputs(), kernel_log=None), clock, inline=True)
    engine = Engine()
    view = engine.hello(agent.hello(), 0.0)
    arrived: dict[str, float] = {}
    names: set[str] = set()
    for step in range(12):
        t = float(step)
        clock.t = t
        sim.advance(t)
        batch = sent(agent.step_inline(t))
        for event in batch.events:
            if event.gpu == 1 and isinstance(event, GpuStateChanged) and event.state == "lost":
                arrived.setdefault("gpu_lost", t)
            if event.gpu == 1 and isinstance(event, XidOccurred):
                arrived.setdefault("xid", t)
        engine.ingest(view, batch, t)
        engine.tick(t)
        names |= {v.reason for v in engine.book.by_id.values() if v.gpu == 1 and v.detector == "hardware"}
    agent.collectors.close()
    assert arrived["gpu_lost"] == 3.0 and arrived["xid"] > arrived["gpu_lost"], arrived  # lost came first
    assert names == {"xid_79"}
    (verdict,) = [v for v in engine.book.open.values() if v.gpu == 1 and v.detector == "hardware"]
    assert "NVML: GPU is lost (fallen off the bus)" in verdict.evidence


def test_an_nccl_line_is_classified_and_placed_on_its_gpu_by_its_pid() -> None:
    batches = _run(6.0)["host-001"]
    logs = [e for e in _events(batches) if isinstance(e, LogLine) and e.source.startswith("log:")]
    assert logs, "the NCCL WARN line reached no batch"
    assert all(e.line_kind == "nccl_warn_net" and e.pid is not None for e in logs)
    assert {e.gpu for e in logs} == {2}  # the line names no GPU: the agent found it from the pid
    assert logs[0].source.startswith("log:/var/log/sentinel-sim/nccl.host-001.")


def test_jobs_and_heads_come_from_the_process_table_and_the_probe_socket() -> None:
    batches = _run(2.0)["host-000"]
    procs = batches[0].procs
    assert procs is not None
    assert sorted((p.gpu, p.job_id, p.rank, p.local_rank) for p in procs) == [
        (g, "train", g, g) for g in range(4)
    ]
    heads = batches[0].heads
    assert sorted((h.host, h.gpu, h.rank) for h in heads) == [("host-000", g, g) for g in range(4)]
    assert batches[1].heads == []  # the probe's cadence is 2 s
    assert batches[1].procs is None  # unchanged mapping is not resent


def test_a_hung_nvml_call_is_reported_unresponsive_by_the_inline_worker() -> None:
    batches = _run(6.0)["host-000"]
    states = [next((s.state for s in b.samples if s.gpu == 3), None) for b in batches]
    assert states[:3] == ["ok", "ok", "ok"] and set(states[3:]) == {"unresponsive"}
    changed = [e for e in _events(batches) if isinstance(e, GpuStateChanged) and e.state == "unresponsive"]
    assert [(e.gpu, e.t) for e in changed] == [(3, 3.0)]


def test_the_inline_worker_answers_a_declared_hang_as_the_threaded_one_does_at_its_deadline() -> None:
    worker = InlineWorker("gpu0")
    calls: list[int] = []

    def hangs() -> int:
        calls.append(1)
        raise CallBlocks("simulated")

    async def call() -> int:
        return await worker.call(hangs, 2.0)

    with pytest.raises(Unresponsive, match="no answer within 2 s"):
        asyncio.run(call())
    with pytest.raises(Unresponsive, match="has not returned"):
        asyncio.run(call())
    assert calls == [1] and worker.busy  # never called again behind the hung call


def test_step_inline_needs_an_inline_agent() -> None:
    scenario = load_scenario_text(SCENARIO)
    sim = SimCluster(scenario, started_at=0.0, clock=lambda: 0.0)
    host = sim.hosts[0]
    agent = Agent(simulated_agent_config(host.name, tick_s=1.0), host, host.inputs(), lambda: 0.0)
    try:
        with pytest.raises(RuntimeError, match="inline=True"):
            agent.step_inline(0.0)
    finally:
        agent.collectors.close()
        sim.close()


def _engine_fed_by_agents(coalesce: int, until: float) -> tuple[Engine, dict[str, float], int]:
    """The scenario's hosts through real inline agents with ``stream.coalesce_ticks``; the engine ingests what
    each tick spooled (None: held), as ``sentinel sim`` does. Returns the engine, when each hardware verdict
    opened, and how many ticks were held."""
    clock = VirtualClock()
    scenario = load_scenario_text(SCENARIO)
    sim = SimCluster(scenario, started_at=0.0, clock=clock, inline=True)
    agents = []
    for host in sim.hosts:
        config = simulated_agent_config(host.name, tick_s=scenario.tick_s, ring_window_s=RING_WINDOW_S)
        config = msgspec.structs.replace(
            config, stream=msgspec.structs.replace(config.stream, coalesce_ticks=coalesce)
        )
        agents.append(Agent(config, host, host.inputs(), clock, inline=True))
    engine = Engine()
    views = [engine.hello(agent.hello(), 0.0) for agent in agents]
    opened: dict[str, float] = {}
    held = 0
    t = 0.0
    while t <= until:
        clock.t = t
        sim.advance(t)
        for agent, view in zip(agents, views, strict=True):
            batch = agent.step_inline(t)
            if batch is None:
                held += 1
                continue
            engine.ingest(view, batch, t)
        engine.tick(t)
        for v in engine.book.open.values():
            if v.detector == "hardware":
                opened.setdefault(f"{v.host}/{v.gpu}/{v.reason}", t)
        t += 1.0
    for agent in agents:
        agent.collectors.close()
    return engine, opened, held


def test_coalescing_agents_hold_routine_ticks_and_the_hardware_verdicts_open_as_promptly() -> None:
    """The simulated agents read slow counters every other tick, so coalescing holds the fast ticks between
    them; the Xid, the lost GPU and the hung NVML call go out at once, and their verdicts open on the same
    tick as with every tick sent."""
    _, every_tick, none_held = _engine_fed_by_agents(1, 8.0)
    engine, coalesced, held = _engine_fed_by_agents(3, 8.0)
    assert none_held == 0 and held > 0
    assert coalesced == every_tick and any("xid_79" in key for key in coalesced)
    assert all(gpu.t >= 7.0 for host in engine.fleet.hosts.values() for gpu in host.gpus)

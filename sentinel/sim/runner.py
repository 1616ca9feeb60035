"""``sentinel sim``: a scenario through the real agent and the real aggregator engine, on a virtual clock.

Every simulated host is watched by a real :class:`~sentinel.agent.agent.Agent` built ``inline`` (no thread,
no event loop) on its :class:`~sentinel.sim.host.SimHost`: the same collector registry, line classifier,
Xid merge, job mapper, probe validation and batch builder as on a GPU host, reading the simulated host at
its OS boundaries. Each tick: the cluster model moves to ``t`` (faults due are applied), every live agent
runs one tick (:meth:`~sentinel.agent.agent.Agent.step_inline`), the engine ingests its batch exactly as the
WebSocket server would (after a hello whenever the agent re-read its inventory, as the stream does on a
reconnect), then the detectors tick. A host taken down stops ticking. Verdicts are recorded when they open;
the report is contract section 4's JSON.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from sentinel.agent.agent import Agent
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.verdicts import Change, Verdict
from sentinel.config.aggregator import AggregatorConfig
from sentinel.sim.host import SimCluster, simulated_agent_config
from sentinel.sim.scenario import Scenario, fault_to_dict

#: an inline agent's ring buffer: nobody asks a virtual-clock agent for a snapshot, so 10 s are kept (every
#: sample still goes through it; a minute's would hold much more memory for large clusters)
RING_WINDOW_S = 10.0
#: the young generation is collected every this many allocations during a run (CPython's default: 700)
GC_YOUNG_THRESHOLD = 10_000


@dataclass
class SimResult:
    scenario: Scenario
    opened: list[Verdict] = field(default_factory=list)
    wall_s: float = 0.0
    ticks: int = 0
    samples: int = 0
    engine: Engine | None = None

    def report(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.to_dict(),
            "faults": [fault_to_dict(f) for f in sorted(self.scenario.faults, key=lambda f: f.at_s)],
            "verdicts": [_report_verdict(v) for v in self.opened],
            "stats": {
                "ticks": self.ticks,
                "gpu_samples": self.samples,
                "wall_s": round(self.wall_s, 3),
                "gpus": self.scenario.cluster.hosts * self.scenario.cluster.gpus_per_host,
            },
        }


def _report_verdict(verdict: Verdict) -> dict[str, Any]:
    return {
        "t_s": round(verdict.opened_at, 3),
        "kind": verdict.kind,
        "host": verdict.host,
        "gpu": verdict.gpu,
        "job": verdict.job,
        "rank": verdict.rank,
        "reason": verdict.reason,
        "action": verdict.action,
        "evidence": list(verdict.evidence),
    }


class VirtualClock:
    """The scenario's time, moved by the runner; every agent and simulated host reads it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulated_agents(scenario: Scenario, clock: VirtualClock) -> tuple[SimCluster, list[Agent]]:
    """The scenario's hosts on the virtual clock, each with its inline agent."""
    sim = SimCluster(scenario, started_at=0.0, clock=clock, inline=True)
    agents = [
        Agent(
            simulated_agent_config(host.name, tick_s=scenario.tick_s, ring_window_s=RING_WINDOW_S),
            host,
            host.inputs(),
            clock,
            inline=True,
        )
        for host in sim.hosts
    ]
    return sim, agents


@contextlib.contextmanager
def batch_gc() -> Iterator[None]:
    """The cyclic collector tuned for a run, restored after it.

    Every tick of every host allocates readings, batch parts and ring entries that mostly die by reference
    count within the tick; at the default threshold the collector ran ~4 times per simulated second on
    1,024 GPUs, each pass traversing what had not died yet, and its full passes scanned the whole model
    (a noticeable share of a run's CPU). What is built before the first tick is frozen out of the scans (``gc.freeze``)
    and the young generation is collected every :data:`GC_YOUNG_THRESHOLD` allocations. Reference cycles are
    still collected, only later: nothing in a run depends on when (no finalizer decides a verdict).
    """
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def run_scenario(
    scenario: Scenario,
    config: AggregatorConfig | None = None,
    *,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Run ``scenario`` to its end and return what opened (deterministic for a given seed)."""
    started = time.perf_counter()
    clock = VirtualClock()
    sim, agents = simulated_agents(scenario, clock)
    engine = Engine(config)
    result = SimResult(scenario=scenario, engine=engine)

    def record(change: Change) -> None:
        if change.what == "opened":
            # a snapshot of the verdict as it opened (it may be updated later)
            v = change.verdict
            result.opened.append(replace(v, evidence=list(v.evidence), extra=dict(v.extra)))

    engine.listeners.append(record)
    hosts = sim.model.hosts
    views = [engine.hello(agent.hello(), 0.0) for agent in agents]
    greeted = [agent.inventory_changes for agent in agents]
    tick = scenario.tick_s
    steps = round(scenario.duration_s / tick)
    samples = 0
    report_every = max(1, steps // 100)
    with batch_gc():
        for step in range(steps + 1):
            t = step * tick
            clock.t = t
            sim.advance(t)
            for i, agent in enumerate(agents):
                if t >= hosts[i].down_at:
                    continue  # the machine died: its agent says nothing more
                batch = agent.step_inline(t)
                if agent.inventory_changes != greeted[i]:  # the stream reconnects with the new inventory
                    greeted[i] = agent.inventory_changes
                    views[i] = engine.hello(agent.hello(), t)
                if batch is not None:  # None: held for the next batch (stream.coalesce_ticks)
                    samples += len(batch.samples)
                    engine.ingest(views[i], batch, t)
            engine.tick(t)
            if progress is not None and step % report_every == 0:
                progress(t)
    for agent in agents:
        agent.collectors.close()
    result.ticks = steps + 1
    result.samples = samples
    result.wall_s = time.perf_counter() - started
    return result

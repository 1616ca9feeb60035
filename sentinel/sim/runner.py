"""``sentinel sim``: drive a scenario through the real aggregator engine on a virtual clock.

Each tick: the cluster model moves to ``t`` (faults due are applied), every live simulated agent produces
its batch, the engine ingests it exactly as the WebSocket server would, then the detectors tick. Verdicts
are recorded when they open; the report is contract section 4's JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.verdicts import Change, Verdict
from sentinel.config.aggregator import AggregatorConfig
from sentinel.sim.agentview import VirtualAgent
from sentinel.sim.cluster import ClusterSim
from sentinel.sim.scenario import Scenario, fault_to_dict


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


def run_scenario(
    scenario: Scenario,
    config: AggregatorConfig | None = None,
    *,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Run ``scenario`` to its end and return what opened (deterministic for a given seed)."""
    started = time.perf_counter()
    cluster = ClusterSim(scenario)
    engine = Engine(config)
    result = SimResult(scenario=scenario, engine=engine)

    def record(change: Change) -> None:
        if change.what == "opened":
            # a snapshot of the verdict as it opened (it may be updated later)
            v = change.verdict
            result.opened.append(replace(v, evidence=list(v.evidence), extra=dict(v.extra)))

    engine.listeners.append(record)
    agents = [VirtualAgent(cluster, host) for host in cluster.hosts]
    views = [engine.hello(agent.hello(0.0), 0.0) for agent in agents]
    tick = scenario.tick_s
    steps = round(scenario.duration_s / tick)
    samples = 0
    report_every = max(1, steps // 100)
    for step in range(steps + 1):
        t = step * tick
        cluster.advance(t)
        cluster.tick_faults(t)
        for agent, view in zip(agents, views, strict=True):
            batch = agent.collect(t)
            if batch is not None:
                samples += len(batch.samples)
                engine.ingest(view, batch, t)
        engine.tick(t)
        if progress is not None and step % report_every == 0:
            progress(t)
    result.ticks = steps + 1
    result.samples = samples
    result.wall_s = time.perf_counter() - started
    return result

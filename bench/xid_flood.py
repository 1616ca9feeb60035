"""What a flood of one Xid line costs the agent and the aggregator, against a single line in the same run.

    .venv/bin/python bench/xid_flood.py [--lines 100000] [--window 10]

One simulated host (8 GPUs, one job) runs the real agent inline on a virtual clock, its batches going into
the real engine. At t=10 s GPU 0's kernel log gets ``--lines`` copies of one Xid 95 line (a driver stuck
repeating itself); the agent and the engine then run to t=40 s. Measured separately for the agent (its
ticks) and the aggregator (ingest and detector ticks): CPU seconds (``time.process_time``) and, in a second
run under ``tracemalloc``, the peak of memory allocated by the measured part. Three runs: one line (the
baseline), the flood with the agent's coalescing (``collect.xid_flood_window_s``), and the flood with it
off (every line an event), which shows what coalescing saves and that the aggregator stays bounded even
then (the agent's bounded batches drop most of such a flood, each drop reported). Goals: every occurrence
counted, at most one event per window after the first; the aggregator no more than twice the single line's
CPU and memory; the agent's coalescing free beside the classification every line gets anyway (CPU and peak
memory no more than 1.1x the run with coalescing off).
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import msgspec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sentinel.agent.agent import Agent  # noqa: E402
from sentinel.aggregator.engine import Engine  # noqa: E402
from sentinel.aggregator.state import HostView  # noqa: E402
from sentinel.sim.cluster import KERN_WARNING  # noqa: E402
from sentinel.sim.host import SimCluster, simulated_agent_config  # noqa: E402
from sentinel.sim.runner import VirtualClock  # noqa: E402
from sentinel.sim.scenario import load_scenario_text  # noqa: E402
from sentinel.wire import Batch, XidOccurred  # noqa: E402

T = TypeVar("T")

SCENARIO = """
duration_s = 40
[cluster]
hosts = 1
gpus_per_host = 8
[[jobs]]
id = "train-a"
"""
FLOOD_AT_S = 10.0
END_S = 40.0
GOAL_AGENT_RATIO = 1.1
GOAL_AGGREGATOR_RATIO = 2.0


class Run(msgspec.Struct, kw_only=True):
    agent_cpu_s: float = 0.0
    aggregator_cpu_s: float = 0.0
    agent_peak_mib: float = 0.0
    aggregator_peak_mib: float = 0.0
    events: int = 0
    occurrences: int = 0
    verdicts: int = 0


def ingest(engine: Engine, view: HostView, batch: Batch, t: float) -> None:
    """The aggregator's share of one tick: the host's batch applied, the detectors run."""
    engine.ingest(view, batch, t)
    engine.tick(t)


def run(lines: int, window_s: float, *, traced: bool) -> Run:
    """One pass: agent and engine side by side, each part's CPU (or, ``traced``, its allocation peak)."""
    scenario = load_scenario_text(SCENARIO, "xid_flood")
    clock = VirtualClock()
    sim = SimCluster(scenario, started_at=0.0, clock=clock, inline=True)
    (host,) = sim.hosts
    config = simulated_agent_config(host.name, tick_s=1.0)
    config.collect.xid_flood_window_s = window_s
    agent = Agent(config, host, host.inputs(), clock, inline=True)
    engine = Engine()
    view = engine.hello(agent.hello(), 0.0)
    gpu = sim.model.hosts[0].gpus[0]
    line = f"NVRM: Xid (PCI:{gpu.pci_bus}): 95, pid={gpu.pid}, name=python, Uncontained memory error"
    out = Run()
    parts = {"agent": 0.0, "aggregator": 0.0}
    peaks = {"agent": 0, "aggregator": 0}

    def measured(part: str, work: Callable[[], T]) -> T:
        if traced:
            tracemalloc.start()
        started = time.process_time()
        result = work()
        parts[part] += time.process_time() - started
        if traced:
            peaks[part] = max(peaks[part], tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        return result

    t = 0.0
    while t <= END_S:
        clock.t = t
        sim.advance(t)
        if t == FLOOD_AT_S:
            sim.model.hosts[0].kernel_lines.extend((t, KERN_WARNING, line) for _ in range(lines))
        batch = measured("agent", partial(agent.step_inline, t))
        assert batch is not None  # stream.coalesce_ticks is 1: every tick is sent
        for event in batch.events:
            if isinstance(event, XidOccurred):
                out.events += 1
                out.occurrences += event.count
        measured("aggregator", partial(ingest, engine, view, batch, t))
        t += 1.0
    agent.collectors.close()
    out.agent_cpu_s, out.aggregator_cpu_s = parts["agent"], parts["aggregator"]
    out.agent_peak_mib = peaks["agent"] / 2**20
    out.aggregator_peak_mib = peaks["aggregator"] / 2**20
    out.verdicts = len(engine.verdicts("open"))
    return out


def measure(lines: int, window_s: float) -> Run:
    cpu = run(lines, window_s, traced=False)
    memory = run(lines, window_s, traced=True)
    cpu.agent_peak_mib, cpu.aggregator_peak_mib = memory.agent_peak_mib, memory.aggregator_peak_mib
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--window", type=float, default=10.0, help="the agent's xid_flood_window_s")
    args = parser.parse_args()
    base = measure(1, args.window)
    flood = measure(args.lines, args.window)
    off = measure(args.lines, 0.0)
    print(
        f"{'run':<28}{'events':>8}{'occurr.':>9}{'agent CPU s':>13}{'agent peak MiB':>16}"
        f"{'aggr CPU s':>12}{'aggr peak MiB':>15}{'open verdicts':>15}"
    )
    for name, r in (
        ("1 line", base),
        (f"{args.lines:,} lines", flood),
        (f"{args.lines:,}, coalescing off", off),
    ):
        print(
            f"{name:<28}{r.events:>8}{r.occurrences:>9}{r.agent_cpu_s:>13.3f}{r.agent_peak_mib:>16.2f}"
            f"{r.aggregator_cpu_s:>12.3f}{r.aggregator_peak_mib:>15.2f}{r.verdicts:>15}"
        )
    windows = (END_S - FLOOD_AT_S) / args.window if args.window else 0
    per_line_us = (flood.agent_cpu_s - base.agent_cpu_s) / max(1, args.lines - 1) * 1e6
    cpu_ratio = flood.aggregator_cpu_s / base.aggregator_cpu_s
    mem_ratio = flood.aggregator_peak_mib / base.aggregator_peak_mib
    print()
    print(
        f"events on the wire: {flood.events} for {flood.occurrences:,} occurrences of {args.lines:,} "
        f"(goal: all counted, <= {1 + windows:.0f} events); coalescing off: {off.events:,} events, "
        f"{off.occurrences:,} occurrences"
    )
    print(
        f"agent: {per_line_us:.1f} us of CPU a line; {flood.agent_cpu_s / off.agent_cpu_s:.2f}x the CPU and "
        f"{flood.agent_peak_mib / off.agent_peak_mib:.2f}x the peak memory of coalescing off "
        f"(goal <= {GOAL_AGENT_RATIO:g}x); peak {flood.agent_peak_mib:.1f} MiB vs "
        f"{base.agent_peak_mib:.1f} MiB for one line"
    )
    print(
        f"aggregator: {cpu_ratio:.2f}x the CPU and {mem_ratio:.2f}x the peak memory of one line "
        f"(goal <= {GOAL_AGGREGATOR_RATIO:g}x); coalescing off: "
        f"{off.aggregator_cpu_s / base.aggregator_cpu_s:.1f}x CPU, "
        f"{off.aggregator_peak_mib / base.aggregator_peak_mib:.1f}x memory"
    )


if __name__ == "__main__":
    main()

"""What the agent's collectors feed (:class:`AgentSink`) and :class:`Collectors`, which runs the due ones
each tick (the collector contract itself is :mod:`sentinel.components.collector`).

A collector never raises out of :meth:`Collectors.run_due`: a failure is logged, counted as success=0
(``sentinel_agent_collector_{duration_seconds,success}``), and the next tick runs it again. Inline mode
(``Collectors(..., inline=True)``, ``sentinel sim``'s virtual clock) runs the same collectors with no
thread and no event loop: blocking calls run on the caller's thread (:class:`InlineWorker`; a simulated
hang is declared, not enacted) and collectors run one after the other.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from sentinel.agent.metrics import AgentCounters, GpuView
from sentinel.agent.worker import GpuWorker, InlineWorker
from sentinel.components.collector import Collector
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.ib.kernel import PortLogLine
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import Event, GpuInfo, GpuSample, ProcInfo

log = get_logger(module="agent.collectors")


class AgentSink(Protocol):
    """What collectors feed: the agent under construction of this tick's batch."""

    host: str
    counters: AgentCounters
    gpus: dict[int, GpuView]
    pci_to_gpu: dict[str, int]

    def add_sample(self, sample: GpuSample) -> None: ...

    def add_event(self, event: Event) -> None: ...

    def set_procs(self, procs: list[ProcInfo]) -> None: ...

    def add_heads(self, heads: list[FrHeads]) -> None: ...

    def set_inventory(self, inventory: list[GpuInfo]) -> None: ...

    def gpu_of_pid(self, pid: int) -> int | None: ...

    def nvml_error(self, function: str, error: str) -> None: ...

    def set_gpu_source(self, health: GpuSourceHealth) -> None: ...

    def note_port_line(self, line: PortLogLine, now: float) -> None:
        """A kernel line about an IB/RoCE port (evidence for the ib component's port records)."""
        ...


class Collectors:
    """Runs every due collector of a tick concurrently (inline: one after the other) and records
    duration/success."""

    def __init__(self, counters: AgentCounters, tick_s: float, *, inline: bool = False) -> None:
        self.counters = counters
        self.tick_s = tick_s
        self.inline = inline
        self.items: list[Collector] = []

    def add(self, collector: Collector) -> None:
        collector.inline = self.inline
        collector.workers = InlineWorker if self.inline else GpuWorker
        self.items.append(collector)

    def get(self, name: str) -> Collector | None:
        return next((c for c in self.items if c.name == name), None)

    async def run_due(self, now: float, *, first: tuple[str, ...] = ("nvml",)) -> None:
        # a collector on the tick's own cadence runs every tick, however late or early the loop woke up
        due = [c for c in self.items if c.interval_s <= self.tick_s or now >= c.next_run]
        leading = [c for c in due if c.name in first]
        rest = [c for c in due if c.name not in first]
        for group in (leading, rest):
            if self.inline:
                for collector in group:
                    await self._run(collector, now)
            elif group:
                await asyncio.gather(*(self._run(c, now) for c in group))

    async def _run(self, collector: Collector, now: float) -> None:
        started = time.perf_counter()
        ok = True
        try:
            await collector.collect(now)
        except Exception as exc:
            ok = False
            log.warning("collector_failed", collector=collector.name, error=f"{type(exc).__name__}: {exc}")
        self.counters.collector_duration[collector.name] = time.perf_counter() - started
        self.counters.collector_success[collector.name] = ok
        # half a tick of slack so a collector whose interval equals the tick runs on every tick
        collector.next_run = now + collector.interval_s - self.tick_s / 2

    def close(self) -> None:
        for collector in self.items:
            try:
                collector.close()
            except Exception as exc:
                log.warning("collector_close_failed", collector=collector.name, error=str(exc))

"""The collector contract: what every collector is (a name, a cadence, :meth:`Collector.collect`) and what it
feeds (:class:`AgentSink`), and :class:`Collectors`, which runs the due ones each tick.

A collector never raises out of :meth:`Collectors.run_due`: a failure is logged, counted as success=0
(``sentinel_agent_collector_{duration_seconds,success}``), and the next tick runs it again. Inline mode
(``Collectors(..., inline=True)``, ``sentinel sim``'s virtual clock) runs the same collectors with no
thread and no event loop: blocking calls run on the caller's thread (:class:`InlineWorker`; a simulated
hang is declared, not enacted) and collectors run one after the other.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from sentinel.agent.metrics import AgentCounters, GpuView
from sentinel.agent.worker import GpuWorker, InlineWorker, Worker
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.ib.kernel import PortLogLine
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import Event, GpuInfo, GpuSample, ProcInfo

log = get_logger(module="agent.collectors")
T = TypeVar("T")


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


class Collector(abc.ABC):
    """Base: ``name``, ``interval_s``; subclasses implement :meth:`collect`.

    Blocking file-system work goes through :meth:`blocking`: a worker thread of this collector with a
    deadline. Reading /proc/<pid>/environ of a process stuck in the GPU driver, or a log file on a hung NFS
    mount, can block for good; the collector then reports failure each tick while its thread stays stuck,
    instead of freezing the tick (and, through the systemd watchdog, restarting the agent into the same hang).
    """

    name = "collector"
    blocking_deadline_s = 5.0

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.next_run = 0.0
        #: set by :class:`Collectors` in inline mode: blocking calls run on the caller's thread
        self.inline = False
        self._worker: Worker | None = None

    @abc.abstractmethod
    async def collect(self, now: float) -> None:
        """Read this collector's source once and record what it found."""

    def new_worker(self, name: str) -> Worker:
        """A worker for blocking calls: a thread with a deadline, or inline under the virtual clock."""
        return InlineWorker(name) if self.inline else GpuWorker(name)

    async def blocking(self, fn: Callable[[], T]) -> T:
        if self._worker is None:
            self._worker = self.new_worker(f"collector-{self.name}")
        return await self._worker.call(fn, self.blocking_deadline_s)

    def close(self) -> None:
        """Release files/sockets/threads."""
        if self._worker is not None:
            self._worker.stop()


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

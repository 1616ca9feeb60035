"""The collector contract: a name, a cadence and :meth:`Collector.collect`, which reads one source and
writes what it found into the sink it was built with.

The agent's own collectors and the host-level components' (IB ports, network interfaces, NCCL RAS) share it;
the agent's runner (``sentinel.agent.collectors.base.Collectors``) schedules them and hands each its
workers: threads with deadlines, or inline workers under ``sentinel sim``'s virtual clock.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Protocol, TypeAlias, TypeVar

from sentinel.components.families import Collector as _Families

T = TypeVar("T")
#: metric families a collector exports (rendered by the agent's own exposition)
Families: TypeAlias = _Families


class Worker(Protocol):
    """Runs blocking calls off the event loop, each with a deadline (``sentinel.agent.worker``)."""

    @property
    def busy(self) -> bool: ...

    async def call(self, fn: Callable[[], T], deadline_s: float) -> T: ...

    def stop(self) -> None: ...


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
        #: set by the runner in inline mode: blocking calls run on the caller's thread
        self.inline = False
        #: set by the runner: makes this collector's workers (a thread with a deadline, or inline)
        self.workers: Callable[[str], Worker] | None = None
        self._worker: Worker | None = None

    @abc.abstractmethod
    async def collect(self, now: float) -> None:
        """Read this collector's source once and record what it found."""

    def families(self) -> list[Families]:
        """The metric families this collector exports on the agent's ``/metrics`` (default: none)."""
        return []

    def new_worker(self, name: str) -> Worker:
        """A worker for blocking calls, made by the runner's factory."""
        if self.workers is None:
            raise RuntimeError(f"collector {self.name}: not added to a runner, it has no workers")
        return self.workers(name)

    async def blocking(self, fn: Callable[[], T]) -> T:
        if self._worker is None:
            self._worker = self.new_worker(f"collector-{self.name}")
        return await self._worker.call(fn, self.blocking_deadline_s)

    def close(self) -> None:
        """Release files/sockets/threads."""
        if self._worker is not None:
            self._worker.stop()


class SourceSettings(Protocol):
    """A host-level source's section of the agent's configuration: whether it runs, how often it reads."""

    @property
    def enabled(self) -> bool: ...
    @property
    def interval_s(self) -> float: ...


class HostBuild(Protocol):
    """What every host-level source's builder reads of the agent's build context (a builder's own Protocol
    adds its ``config`` sections, its ``sink`` and the rest)."""

    @property
    def host(self) -> str: ...
    @property
    def cluster(self) -> str: ...

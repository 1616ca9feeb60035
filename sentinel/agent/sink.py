"""What the collectors feed: this host's facts (GPU inventory, processes, GPU source health) and the tick's
findings on their way into the next batch.

:class:`TickSink` is the one object every collector writes into (it is the :class:`CollectorSink` the
registry hands them); the agent takes its :class:`~sentinel.agent.batch.TickFindings` once per tick
(:meth:`TickSink.take`) and turns them into one batch. Keeping it apart from the agent's lifecycle means a
collector sees only what it may write, never the daemon around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sentinel.agent.batch import TickFindings
from sentinel.agent.collectors.base import AgentSink
from sentinel.agent.metrics import AgentCounters, GpuView
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.components.ib.kernel import PortLogLine
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.tracker import PortTracker
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.components.netdev.record import Netdev
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import Event, GpuInfo, GpuSample, ProcInfo

log = get_logger(module="agent")


class CollectorSink(AgentSink, Protocol):
    """Everything a collector of the registry may write: the agent's own collectors' :class:`AgentSink`
    plus the network components' ports and NCCL RAS answers."""

    #: the ib collector's port history (it hands it over when built), for kernel lines about a port
    port_tracker: PortTracker | None

    def procs(self) -> list[ProcInfo]: ...

    def set_ports(self, ports: list[IbPort]) -> None: ...

    def set_netdevs(self, netdevs: list[Netdev]) -> None: ...

    def set_fabric_manager(self, status: FabricManagerStatus) -> None: ...

    def add_ras(self, status: RasStatus) -> None: ...

    def ras_jobs(self) -> list[str]: ...

    def ras_job_pids(self, job: str) -> list[int]: ...


class TickSink:
    """This host's facts and the findings of the tick in progress (see the module docstring)."""

    def __init__(
        self,
        host: str,
        counters: AgentCounters,
        on_inventory: Callable[[list[GpuInfo]], None] = lambda _: None,
    ) -> None:
        self.host = host
        self.counters = counters
        #: called after the GPU inventory was (re)read: a new hello is due
        self.on_inventory = on_inventory
        self.gpus: dict[int, GpuView] = {}
        self.inventory: list[GpuInfo] = []
        self.gpu_source: GpuSourceHealth | None = None
        self.pci_to_gpu: dict[str, int] = {}
        #: the ib collector's port history, which kernel lines about a port are evidence for
        self.port_tracker: PortTracker | None = None
        self._tick = TickFindings()
        self._procs: list[ProcInfo] = []

    def take(self) -> TickFindings:
        """This tick's findings; the next tick starts empty."""
        tick, self._tick = self._tick, TickFindings()
        return tick

    def set_inventory(self, inventory: list[GpuInfo]) -> None:
        self.inventory = list(inventory)
        self.gpus.clear()
        for info in inventory:
            self.gpus[info.index] = GpuView(info)
        self.pci_to_gpu = {g.pci_bus: g.index for g in inventory if g.pci_bus}
        self.on_inventory(self.inventory)

    def add_sample(self, sample: GpuSample) -> None:
        self._tick.samples.append(sample)

    def add_event(self, event: Event) -> None:
        if not self._tick.add_event(event):
            self.counters.drop_parts["events_over_cap"] += 1

    def add_heads(self, heads: list[FrHeads]) -> None:
        self._tick.add_heads(heads)

    def procs(self) -> list[ProcInfo]:
        """The GPU processes of this host and their jobs, as last mapped (the probe checks senders against it)."""
        return self._procs

    def set_procs(self, procs: list[ProcInfo]) -> None:
        if procs != self._procs:
            self._procs = list(procs)
            self._tick.procs = self._procs
            for view in self.gpus.values():
                view.job, view.rank = "", ""
            for proc in procs:
                found = self.gpus.get(proc.gpu)
                if found is not None and proc.job_id and not found.job:
                    found.job = proc.job_id
                    found.rank = str(proc.rank) if proc.rank is not None else ""

    def set_ports(self, ports: list[IbPort]) -> None:
        self._tick.ports = ports

    def set_netdevs(self, netdevs: list[Netdev]) -> None:
        self._tick.netdevs = netdevs

    def set_fabric_manager(self, status: FabricManagerStatus) -> None:
        self._tick.fabric_manager = status

    def note_port_line(self, line: PortLogLine, now: float) -> None:
        if self.port_tracker is not None:
            self.port_tracker.note_kernel_line(line, now)

    def add_ras(self, status: RasStatus) -> None:
        self._tick.ras.append(status)

    def ras_jobs(self) -> list[str]:
        """Jobs whose global rank 0 runs here: this host asks NCCL RAS on the job's behalf."""
        return sorted({p.job_id for p in self._procs if p.job_id and p.rank == 0})

    def ras_job_pids(self, job: str) -> list[int]:
        """The job's processes on this host: the RAS port's listener must belong to one of their users."""
        return [p.pid for p in self._procs if p.job_id == job]

    def gpu_of_pid(self, pid: int) -> int | None:
        return next((p.gpu for p in self._procs if p.pid == pid), None)

    def set_gpu_source(self, health: GpuSourceHealth) -> None:
        """The GPU source's health changed (or was re-checked): the next batch and every hello carry it."""
        if health != self.gpu_source:
            self.gpu_source = health
            self._tick.gpu_source = health
            if not health.ok or health.found < health.expected:
                log.error(
                    "gpu_source_degraded", error=health.error, found=health.found, expected=health.expected
                )

    def nvml_error(self, function: str, error: str) -> None:
        self.counters.nvml_errors[(function, error)] += 1

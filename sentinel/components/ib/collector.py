"""The agent's ``ib`` collector: read the ports (off the loop, with a deadline), apply the history, ship.

A host without ``class/infiniband`` (no HCA, or a container without /sys) reports no ports and succeeds;
files that cannot be read are counted in ``sentinel_ib_read_errors`` and logged once per distinct problem,
and the ports that could be read are still shipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sentinel.components.collector import Collector, Families, HostBuild, SourceSettings
from sentinel.components.ib.metrics import IbPortMetrics
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.sysfs import PortScan, PortSource, SysfsPorts
from sentinel.components.ib.tracker import PortTracker
from sentinel.log import get_logger

log = get_logger(module="components.ib")
MAX_LOGGED_PROBLEMS = 64


class PortSink(Protocol):
    pci_to_gpu: dict[str, int]
    #: the port history kernel lines about a port are evidence for (the collector hands over its own)
    port_tracker: PortTracker | None

    def set_ports(self, ports: list[IbPort]) -> None: ...


class SimulatedPorts(Protocol):
    #: a simulated host's ports (None: the machine's own sysfs)
    @property
    def ib_ports(self) -> PortSource | None: ...


class IbSettings(SourceSettings, Protocol):
    """The agent's ``[ib]`` section."""

    @property
    def sysfs_root(self) -> str: ...
    @property
    def flap_window_s(self) -> float: ...
    @property
    def error_window_s(self) -> float: ...


class StateDir(Protocol):
    @property
    def state_dir(self) -> str: ...


class IbAgentConfig(Protocol):
    """What the ``ib`` collector reads of the agent's configuration."""

    @property
    def ib(self) -> IbSettings: ...
    @property
    def agent(self) -> StateDir: ...


class IbBuild(HostBuild, Protocol):
    """What the ``ib`` collector is built from (the agent's build context)."""

    @property
    def config(self) -> IbAgentConfig: ...
    @property
    def sink(self) -> PortSink: ...
    @property
    def inputs(self) -> SimulatedPorts: ...
    #: state that outlives a restart is kept (an existing state dir)
    @property
    def durable(self) -> bool: ...


class IbPortReader:
    """The collector's work without the agent's scheduling (also used by ``sentinel agent once``)."""

    def __init__(self, source: PortSource, tracker: PortTracker, metrics: IbPortMetrics) -> None:
        self.source = source
        self.tracker = tracker
        self.metrics = metrics
        self._logged: set[str] = set()

    def apply(self, scan: PortScan, now: float) -> list[IbPort]:
        ports = self.tracker.update(scan.ports, now)
        self.metrics.ports = ports
        self.metrics.ports_present = scan.present
        self.metrics.read_errors += len(scan.errors)
        for problem in scan.errors:
            if problem not in self._logged and len(self._logged) < MAX_LOGGED_PROBLEMS:
                self._logged.add(problem)
                log.warning("ib_read_problem", problem=problem[:300])
        return ports


class IbCollector(Collector):
    """Reads every port each ``interval_s`` in the collector's worker thread (sysfs reads can block on a
    wedged driver), then records them into the tick's batch."""

    name = "ib"

    def __init__(self, sink: PortSink, reader: IbPortReader, interval_s: float) -> None:
        super().__init__(interval_s)
        self.sink = sink
        self.reader = reader

    async def collect(self, now: float) -> None:
        source = self.reader.source
        source.gpus = dict(self.sink.pci_to_gpu)
        scan = await self.blocking(source.read)
        self.sink.set_ports(self.reader.apply(scan, now))

    def families(self) -> list[Families]:
        return [self.reader.metrics]


def build(ctx: IbBuild) -> IbCollector | None:
    """IB/RoCE ports: from sysfs, or from a simulated host that offers a port source (``ib_ports``); the
    port history goes to the sink too, for the kernel lines about a port."""
    c = ctx.config.ib
    if not c.enabled:
        return None
    sim_source = ctx.inputs.ib_ports
    source: PortSource = sim_source if sim_source is not None else SysfsPorts(c.sysfs_root)
    state_dir = Path(ctx.config.agent.state_dir)
    tracker = PortTracker(
        flap_window_s=c.flap_window_s,
        error_window_s=c.error_window_s,
        state_path=state_dir / "ib_ports.json" if ctx.durable and sim_source is None else None,
    )
    ctx.sink.port_tracker = tracker
    metrics = IbPortMetrics(ctx.cluster, ctx.host)
    return IbCollector(ctx.sink, IbPortReader(source, tracker, metrics), c.interval_s)

"""The agent's ``netdev`` collector: read the interfaces in its deadline worker, apply the rates, ship.

Files that cannot be read are counted in ``sentinel_netdev_read_errors`` and logged once per distinct
problem; the interfaces that could be read are still shipped.
"""

from __future__ import annotations

from typing import Protocol

from sentinel.components.collector import Collector, Families, HostBuild, SourceSettings
from sentinel.components.netdev.metrics import NetdevMetrics
from sentinel.components.netdev.qdisc import NetlinkQdiscs
from sentinel.components.netdev.record import Netdev
from sentinel.components.netdev.sysfs import NetdevScan, SysfsNetdevs
from sentinel.components.netdev.tracker import NetdevRates
from sentinel.log import get_logger

log = get_logger(module="components.netdev")
MAX_LOGGED_PROBLEMS = 64


class NetdevSource(Protocol):
    def read(self) -> NetdevScan: ...


class NetdevSink(Protocol):
    def set_netdevs(self, netdevs: list[Netdev]) -> None: ...


class SimulatedHost(Protocol):
    #: a simulated host's IB ports (its job traffic): set on a simulated host only
    @property
    def ib_ports(self) -> object | None: ...


class NetdevSettings(SourceSettings, Protocol):
    """The agent's ``[netdev]`` section."""

    @property
    def sysfs_root(self) -> str: ...
    @property
    def qdiscs(self) -> bool: ...
    @property
    def netns(self) -> str: ...


class NetdevAgentConfig(Protocol):
    """What the ``netdev`` collector reads of the agent's configuration."""

    @property
    def netdev(self) -> NetdevSettings: ...


class NetdevBuild(HostBuild, Protocol):
    """What the ``netdev`` collector is built from (the agent's build context)."""

    @property
    def config(self) -> NetdevAgentConfig: ...
    @property
    def sink(self) -> NetdevSink: ...
    @property
    def inputs(self) -> SimulatedHost: ...


class NetdevCollector(Collector):
    name = "netdev"

    def __init__(
        self, sink: NetdevSink, source: NetdevSource, metrics: NetdevMetrics, interval_s: float
    ) -> None:
        super().__init__(interval_s)
        self.sink = sink
        self.source = source
        self.metrics = metrics
        self.rates = NetdevRates()
        self._logged: set[str] = set()

    async def collect(self, now: float) -> None:
        scan = await self.blocking(self.source.read)
        netdevs = self.rates.update(scan.netdevs, now)
        self.metrics.netdevs = netdevs
        self.metrics.read_errors += len(scan.errors)
        for problem in scan.errors:
            if problem not in self._logged and len(self._logged) < MAX_LOGGED_PROBLEMS:
                self._logged.add(problem)
                log.warning("netdev_read_problem", problem=problem[:300])
        self.sink.set_netdevs(netdevs)

    def families(self) -> list[Families]:
        return [self.metrics]


def build(ctx: NetdevBuild) -> NetdevCollector | None:
    """Network interfaces from sysfs (a simulated host has none: its job traffic is on its IB ports)."""
    c = ctx.config.netdev
    if not c.enabled or ctx.inputs.ib_ports is not None:
        return None
    metrics = NetdevMetrics(ctx.cluster, ctx.host)
    qdiscs = NetlinkQdiscs(netns=c.netns) if c.qdiscs else None
    return NetdevCollector(ctx.sink, SysfsNetdevs(c.sysfs_root, qdiscs), metrics, c.interval_s)

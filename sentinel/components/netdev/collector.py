"""The agent's ``netdev`` collector: read the interfaces in its deadline worker, apply the rates, ship.

Files that cannot be read are counted in ``sentinel_netdev_read_errors`` and logged once per distinct
problem; the interfaces that could be read are still shipped.
"""

from __future__ import annotations

from typing import Protocol

from sentinel.components.collector import Collector
from sentinel.components.netdev.metrics import NetdevMetrics
from sentinel.components.netdev.record import Netdev
from sentinel.components.netdev.sysfs import NetdevScan
from sentinel.components.netdev.tracker import NetdevRates
from sentinel.log import get_logger

log = get_logger(module="components.netdev")
MAX_LOGGED_PROBLEMS = 64


class NetdevSource(Protocol):
    def read(self) -> NetdevScan: ...


class NetdevSink(Protocol):
    def set_netdevs(self, netdevs: list[Netdev]) -> None: ...


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

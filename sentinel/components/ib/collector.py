"""The agent's ``ib`` collector: read the ports (off the loop, with a deadline), apply the history, ship.

A host without ``class/infiniband`` (no HCA, or a container without /sys) reports no ports and succeeds;
files that cannot be read are counted in ``sentinel_ib_read_errors`` and logged once per distinct problem,
and the ports that could be read are still shipped.
"""

from __future__ import annotations

from typing import Protocol

from sentinel.components.collector import Collector
from sentinel.components.ib.metrics import IbPortMetrics
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.sysfs import PortScan, PortSource
from sentinel.components.ib.tracker import PortTracker
from sentinel.log import get_logger

log = get_logger(module="components.ib")
MAX_LOGGED_PROBLEMS = 64


class PortSink(Protocol):
    pci_to_gpu: dict[str, int]

    def set_ports(self, ports: list[IbPort]) -> None: ...


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

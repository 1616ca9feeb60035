"""The agent's ``fabric_manager`` collector: the fabric manager's service state, read off the loop through
an injected :class:`~sentinel.components.fabric.manager.UnitReader`, exported and shipped.

A host without the unit (no NVSwitch) exports and ships nothing, and once systemd has said so asks again
only every :data:`ABSENT_RECHECK_S` (one ``systemctl`` process every 15 s on every GPU host without a switch would be
most of the collector's cost, for a unit that appears only with a driver install). A failed read is an empty
answer (the unit reads as absent, but is asked again at the usual interval), counted in
``sentinel_fabric_manager_read_errors_total`` and logged once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Protocol

from sentinel.components.collector import Collector, Families, HostBuild, SourceSettings
from sentinel.components.fabric.manager import UNIT, Systemctl, UnitReader, parse_show, status_after
from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.components.families import Collector as MetricFamilies
from sentinel.components.families import CounterMetricFamily, GaugeMetricFamily, Metric
from sentinel.log import get_logger

log = get_logger(module="components.fabric")

#: how often a host whose systemd has no fabric manager unit asks again, seconds
ABSENT_RECHECK_S: Final = 300.0


class FabricManagerSink(Protocol):
    def set_fabric_manager(self, status: FabricManagerStatus) -> None: ...


class FabricManagerMetrics(MetricFamilies):
    """``sentinel_fabric_manager_up`` (only where the unit exists) and the read failures."""

    def __init__(self, cluster: str, host: str) -> None:
        self.labels = [cluster, host]
        self.status: FabricManagerStatus | None = None
        self.read_errors = 0

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "sentinel_fabric_manager_up",
            "1 when nvidia-fabricmanager runs, 0 when it does not (only on hosts that have the unit)",
            labels=["cluster", "host", "state"],
        )
        status = self.status
        if status is not None and status.present:
            up.add_metric([*self.labels, status.state], 1.0 if status.running else 0.0)
        errors = CounterMetricFamily(
            "sentinel_fabric_manager_read_errors",
            "systemctl answers that could not be read (the unit then reads as absent)",
            labels=["cluster", "host"],
        )
        errors.add_metric(self.labels, float(self.read_errors))
        yield up
        yield errors


class FabricManagerCollector(Collector):
    name = "fabric_manager"

    def __init__(
        self, sink: FabricManagerSink, reader: UnitReader, metrics: FabricManagerMetrics, interval_s: float
    ) -> None:
        super().__init__(interval_s)
        self.present_interval_s = interval_s
        self.sink = sink
        self.reader = reader
        self.metrics = metrics

    async def collect(self, now: float) -> None:
        text = await self.blocking(lambda: self.reader.show(UNIT))
        unit = parse_show(text)
        if not unit.load:
            self.metrics.read_errors += 1
            if self.metrics.read_errors == 1:
                log.warning("fabric_manager_unreadable", unit=UNIT)
        previous = self.metrics.status
        status = status_after(previous, unit, now)
        self.metrics.status = status
        # the scheduler reads the interval after each run; a failed read is asked again soon
        self.interval_s = (
            max(self.present_interval_s, ABSENT_RECHECK_S) if unit.absent else self.present_interval_s
        )
        if status.present or (previous is not None and previous.present):
            self.sink.set_fabric_manager(status)

    def families(self) -> list[Families]:
        return [self.metrics]


class SimulatedUnit(Protocol):
    """A simulated host's inputs: whether it is simulated, and its fabric manager's answer if it has one."""

    @property
    def simulated(self) -> bool: ...
    @property
    def fabric_manager(self) -> UnitReader | None: ...


class FabricManagerAgentConfig(Protocol):
    """What the ``fabric_manager`` collector reads of the agent's configuration."""

    @property
    def fabric_manager(self) -> SourceSettings: ...


class FabricManagerBuild(HostBuild, Protocol):
    """What the ``fabric_manager`` collector is built from (the agent's build context)."""

    @property
    def config(self) -> FabricManagerAgentConfig: ...
    @property
    def sink(self) -> FabricManagerSink: ...
    @property
    def inputs(self) -> SimulatedUnit: ...


def build(ctx: FabricManagerBuild) -> FabricManagerCollector | None:
    """The fabric manager's service: through systemd, or a simulated host's answer (``fabric_manager``)."""
    c = ctx.config.fabric_manager
    if not c.enabled or (ctx.inputs.simulated and ctx.inputs.fabric_manager is None):
        return None
    reader: UnitReader = ctx.inputs.fabric_manager or Systemctl()
    metrics = FabricManagerMetrics(ctx.cluster, ctx.host)
    return FabricManagerCollector(ctx.sink, reader, metrics, c.interval_s)

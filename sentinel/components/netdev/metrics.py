"""The agent's ``sentinel_netdev_*`` series, rendered at scrape time from the latest interface records.

Labels ``cluster, host, netdev`` (plus ``counter`` / ``direction``): bytes and packets each way, the error
and drop counters, whether the interface is up, its speed; and the read problems counted.
"""

from __future__ import annotations

from collections.abc import Iterator

from sentinel.components.families import Collector, CounterMetricFamily, GaugeMetricFamily, Metric
from sentinel.components.netdev.record import ERROR_COUNTERS, QDISC_COUNTERS, Netdev

LABELS = ["cluster", "host", "netdev"]
_DIRECTED = {"rx_bytes": ("bytes", "rx"), "tx_bytes": ("bytes", "tx"), "rx_packets": ("packets", "rx")}
_DIRECTED["tx_packets"] = ("packets", "tx")


class NetdevMetrics(Collector):
    """Holds the latest records (set by the collector each read) and the read-problem count."""

    def __init__(self, cluster: str, host: str) -> None:
        self.cluster = cluster
        self.host = host
        self.netdevs: list[Netdev] = []
        self.read_errors = 0
        #: the families of the records and count they were made from: scraped every second, read less often
        self._made: tuple[tuple[Netdev, ...], int, list[Metric]] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        made = self._made
        netdevs = tuple(self.netdevs)
        if (
            made is None
            or made[1] != self.read_errors
            or len(made[0]) != len(netdevs)
            or any(a is not b for a, b in zip(made[0], netdevs, strict=True))
        ):
            made = self._made = (netdevs, self.read_errors, list(self._families(netdevs)))
        return iter(made[2])

    def _families(self, netdevs: tuple[Netdev, ...]) -> Iterator[Metric]:
        base = [self.cluster, self.host]
        up = GaugeMetricFamily("sentinel_netdev_up", "1 when operstate is up", labels=LABELS)
        speed = GaugeMetricFamily(
            "sentinel_netdev_speed_bytes_per_second", "the link speed the driver reports", labels=LABELS
        )
        data = CounterMetricFamily(
            "sentinel_netdev_data_bytes", "bytes each way", labels=[*LABELS, "direction"]
        )
        packets = CounterMetricFamily(
            "sentinel_netdev_packets", "packets each way", labels=[*LABELS, "direction"]
        )
        errors = CounterMetricFamily(
            "sentinel_netdev_errors", "error and drop counters (statistics/)", labels=[*LABELS, "counter"]
        )
        qdisc = CounterMetricFamily(
            "sentinel_netdev_qdisc",
            "the root qdisc's overlimits (waited for the shaper), drops and requeues",
            labels=[*LABELS, "counter"],
        )
        backlog = GaugeMetricFamily(
            "sentinel_netdev_qdisc_backlog_bytes", "bytes waiting in the root qdisc", labels=LABELS
        )
        for d in netdevs:
            labels = [*base, d.name]
            up.add_metric(labels, 1.0 if d.operstate == "up" else 0.0)
            if d.speed_mbps is not None:
                speed.add_metric(labels, d.speed_mbps * 1e6 / 8)
            for name, value in sorted(d.counters.items()):
                if name in _DIRECTED:
                    family, direction = _DIRECTED[name]
                    (data if family == "bytes" else packets).add_metric([*labels, direction], float(value))
                elif name in ERROR_COUNTERS:
                    errors.add_metric([*labels, name], float(value))
                elif name in QDISC_COUNTERS:
                    qdisc.add_metric([*labels, name.removeprefix("qdisc_")], float(value))
            if d.qdisc:
                backlog.add_metric(labels, float(d.qdisc_backlog_bytes))
        yield from (up, speed, data, packets, errors, qdisc, backlog)
        read_errors = CounterMetricFamily(
            "sentinel_netdev_read_errors",
            "files under class/net that could not be read or parsed",
            labels=["cluster", "host"],
        )
        read_errors.add_metric(base, float(self.read_errors))
        yield read_errors

"""The agent's ``sentinel_ib_port_*`` series, rendered at scrape time from the latest port records.

Labels: ``cluster, host, device, port`` on every series (plus ``counter`` / ``direction`` where named);
``sentinel_ib_port_info`` carries the rest (link layer, netdev, PCI address, GPUs served) so a join adds
them where a panel needs them without multiplying every series. Data counters are converted to bytes
(sysfs counts 32-bit words).
"""

from __future__ import annotations

from collections.abc import Iterator

from sentinel.components.families import Collector, CounterMetricFamily, GaugeMetricFamily, Metric
from sentinel.components.ib.record import DATA_WORD_BYTES, ERROR_COUNTERS, IbPort

PORT_STATES = ("active", "down", "init", "armed")
LABELS = ["cluster", "host", "device", "port"]


class IbPortMetrics(Collector):
    """Holds the latest records (set by the collector each read) and the read-error count."""

    def __init__(self, cluster: str, host: str) -> None:
        self.cluster = cluster
        self.host = host
        self.ports: list[IbPort] = []
        self.read_errors = 0
        self.ports_present = False

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        base = [self.cluster, self.host]
        info = GaugeMetricFamily(
            "sentinel_ib_port_info",
            "IB/RoCE port identity and the GPUs it serves; always 1",
            labels=[*LABELS, "link_layer", "netdev", "pci_bus", "numa_node", "gpus", "locality"],
        )
        up = GaugeMetricFamily("sentinel_ib_port_up", "1 when the port is ACTIVE and LinkUp", labels=LABELS)
        state = GaugeMetricFamily(
            "sentinel_ib_port_state",
            "1 for the port's logical state (active, down, init, armed, other), 0 for the others",
            labels=[*LABELS, "state"],
        )
        rate = GaugeMetricFamily(
            "sentinel_ib_port_rate_bytes_per_second", "negotiated link rate", labels=LABELS
        )
        errors = CounterMetricFamily(
            "sentinel_ib_port_errors", "IBTA port error counters (counters/)", labels=[*LABELS, "counter"]
        )
        hw = CounterMetricFamily(
            "sentinel_ib_port_hw_counter",
            "driver counters (hw_counters/ and other counters/ files)",
            labels=[*LABELS, "counter"],
        )
        data = CounterMetricFamily(
            "sentinel_ib_port_data_bytes", "bytes sent and received", labels=[*LABELS, "direction"]
        )
        packets = CounterMetricFamily(
            "sentinel_ib_port_packets", "packets sent and received", labels=[*LABELS, "direction"]
        )
        downs = GaugeMetricFamily(
            "sentinel_ib_port_link_downs_in_window",
            "losses of link within the agent's flap window (survives agent restarts)",
            labels=LABELS,
        )
        for p in self.ports:
            labels = [*base, p.device, str(p.port)]
            info.add_metric(
                [
                    *labels,
                    p.link_layer,
                    p.netdev,
                    p.pci_bus,
                    "" if p.numa_node is None else str(p.numa_node),
                    ",".join(str(g) for g in p.gpus),
                    p.locality,
                ],
                1.0,
            )
            up.add_metric(labels, 1.0 if p.up else 0.0)
            current = p.state if p.state in PORT_STATES else "other"
            for name in (*PORT_STATES, "other"):
                state.add_metric([*labels, name], 1.0 if name == current else 0.0)
            rate.add_metric(labels, p.rate_gbps * 1e9 / 8)
            for name, value in sorted(p.counters.items()):
                if name in ERROR_COUNTERS:
                    errors.add_metric([*labels, name], float(value))
                elif name == "port_xmit_data":
                    data.add_metric([*labels, "tx"], float(value * DATA_WORD_BYTES))
                elif name == "port_rcv_data":
                    data.add_metric([*labels, "rx"], float(value * DATA_WORD_BYTES))
                elif name == "port_xmit_packets":
                    packets.add_metric([*labels, "tx"], float(value))
                elif name == "port_rcv_packets":
                    packets.add_metric([*labels, "rx"], float(value))
                else:
                    hw.add_metric([*labels, name], float(value))
            downs.add_metric(labels, float(len(p.downs)))
        yield from (info, up, state, rate, errors, hw, data, packets, downs)
        read_errors = CounterMetricFamily(
            "sentinel_ib_read_errors",
            "sysfs files under class/infiniband that could not be read or parsed",
            labels=["cluster", "host"],
        )
        read_errors.add_metric(base, float(self.read_errors))
        yield read_errors

"""The PCIe component's families: throughput and the replay counter."""

from __future__ import annotations

from typing import Final

from sentinel.components.exposition import Gauge, MetricsView, Writer, gauges

KIB = 1024.0
GAUGES: Final[tuple[Gauge, ...]] = (
    ("pcie_tx_kbps", "sentinel_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", KIB, 1.0),
    ("pcie_rx_kbps", "sentinel_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", KIB, 1.0),
)


def render(out: Writer, view: MetricsView) -> None:
    fast = view.fast()
    gauges(out, fast, GAUGES)
    out.family("sentinel_gpu_pcie_replay_total", "counter", "PCIe replay counter")
    for sample, labels in fast:
        if sample.pcie_replay is not None:
            out.line("sentinel_gpu_pcie_replay_total", labels, float(sample.pcie_replay))
    render_link(out, view)


LINK = (
    ("gen", "sentinel_gpu_pcie_link_generation", "PCIe link generation now"),
    ("gen_max", "sentinel_gpu_pcie_link_generation_max", "PCIe link generation the GPU and slot support"),
    ("width", "sentinel_gpu_pcie_link_width", "PCIe link width (lanes) now"),
    ("width_max", "sentinel_gpu_pcie_link_width_max", "PCIe link width (lanes) the GPU and slot support"),
)


def render_link(out: Writer, view: MetricsView) -> None:
    links = [(s.pcie_link, lab) for s, lab in view.slow() if s.pcie_link is not None]
    for attr, name, doc in LINK:
        out.family(name, "gauge", doc)
        for link, lab in links:
            value = getattr(link, attr)
            if value is not None:
                out.line(name, lab, float(value))

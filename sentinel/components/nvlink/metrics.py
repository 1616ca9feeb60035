"""The NVLink component's families: link up, error counters, Blackwell bit-error rates."""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer
from sentinel.components.nvlink.record import COUNTERS


def render(out: Writer, view: MetricsView) -> None:
    links = [(link, lab) for sample, lab in view.slow() for link in sample.nvlink or []]
    out.family("sentinel_gpu_nvlink_up", "gauge", "1 when the NVLink link is active")
    for link, lab in links:
        out.line("sentinel_gpu_nvlink_up", lab, 1.0 if link.active else 0.0, f'link="{link.link}"')
    name = "sentinel_gpu_nvlink_errors_total"
    out.family(name, "counter", "NVLink error counters (only those this GPU's NVML reports)")
    for link, lab in links:
        for attr, kind in COUNTERS:
            value = getattr(link, attr)
            if value is not None:
                out.line(name, lab, float(value), f'link="{link.link}",type="{kind}"')
    name = "sentinel_gpu_nvlink_bit_error_rate"
    out.family(name, "gauge", "NVLink bit-error rate (Blackwell): symbol (before FEC) and effective (after)")
    for link, lab in links:
        if link.symbol_ber is not None:
            out.line(name, lab, link.symbol_ber, f'link="{link.link}",type="symbol"')
        if link.effective_ber is not None:
            out.line(name, lab, link.effective_ber, f'link="{link.link}",type="effective"')

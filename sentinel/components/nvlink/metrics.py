"""The NVLink component's families: link up, error counters, Blackwell bit-error rates.

About a thousand series on an 8-GPU host, read on the slow tick but scraped every second.
"""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer
from sentinel.components.nvlink.record import COUNTERS
from sentinel.wire import GpuSample


def render(out: Writer, view: MetricsView) -> None:
    """Written from the slow samples only: the agent keeps the text between slow ticks
    (:class:`~sentinel.components.exposition.KeptFamilies`)."""
    _write(out, view.slow())  # the families even with no GPU yet


def _write(out: Writer, rows: list[tuple[GpuSample, str]]) -> None:
    links = [(link, lab) for sample, lab in rows for link in sample.nvlink or []]
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

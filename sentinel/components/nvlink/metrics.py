"""The NVLink component's families: link up, error counters."""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer


def render(out: Writer, view: MetricsView) -> None:
    links = [(link, lab) for sample, lab in view.slow() for link in sample.nvlink or []]
    out.family("sentinel_gpu_nvlink_up", "gauge", "1 when the NVLink link is active")
    for link, lab in links:
        out.line("sentinel_gpu_nvlink_up", lab, 1.0 if link.active else 0.0, f'link="{link.link}"')
    name = "sentinel_gpu_nvlink_errors_total"
    out.family(name, "counter", "NVLink error counters")
    for link, lab in links:
        out.line(name, lab, float(link.crc_errors), f'link="{link.link}",type="crc"')
        out.line(name, lab, float(link.replay_errors), f'link="{link.link}",type="replay"')
        out.line(name, lab, float(link.recovery_errors), f'link="{link.link}",type="recovery"')

"""The device component's families: identity, NVML state, utilisation and framebuffer memory."""

from __future__ import annotations

from typing import Final, get_args

from sentinel.components.device.record import GpuState
from sentinel.components.exposition import (
    Gauge,
    MetricsView,
    Writer,
    escape,
    gauges,
    keep_block,
    kept_block,
)

GPU_STATES: Final[tuple[GpuState, ...]] = get_args(GpuState)
GAUGES: Final[tuple[Gauge, ...]] = (
    ("util_gpu_pct", "sentinel_gpu_utilization_ratio", "GPU (SM) utilization, 0..1", 1.0, 100.0),
    (
        "util_mem_pct",
        "sentinel_gpu_memory_utilization_ratio",
        "memory controller utilization, 0..1",
        1.0,
        100.0,
    ),
    ("mem_used_bytes", "sentinel_gpu_memory_used_bytes", "framebuffer memory in use", 1.0, 1.0),
    ("mem_total_bytes", "sentinel_gpu_memory_total_bytes", "framebuffer memory size", 1.0, 1.0),
)


def render(out: Writer, view: MetricsView) -> None:
    out.family("sentinel_gpu_info", "gauge", "GPU identity; always 1")
    for row in view.rows:
        g = row.info
        key = (g.name, g.driver, g.vbios, g.serial)
        text = kept_block(("sentinel_gpu_info", row.labels), key)
        if text is None:
            extra = (
                f'name="{escape(g.name)}",driver="{escape(g.driver)}",'
                f'vbios="{escape(g.vbios)}",serial="{escape(g.serial)}"'
            )
            fresh = Writer()
            fresh.line("sentinel_gpu_info", row.labels, 1.0, extra)
            text = keep_block(("sentinel_gpu_info", row.labels), key, fresh.text())
        out.raw(text)
    out.family(
        "sentinel_gpu_up", "gauge", "1 when the GPU answers NVML, 0 when lost, unresponsive or unavailable"
    )
    for row in view.rows:
        out.line("sentinel_gpu_up", row.labels, 1.0 if row.state == "ok" else 0.0)
    out.family("sentinel_gpu_state", "gauge", "1 for the GPU's current state, 0 for the others")
    for row in view.rows:
        text = kept_block(("sentinel_gpu_state", row.labels), row.state)
        if text is None:
            fresh = Writer()
            for s in GPU_STATES:
                fresh.line("sentinel_gpu_state", row.labels, 1.0 if row.state == s else 0.0, f'state="{s}"')
            text = keep_block(("sentinel_gpu_state", row.labels), row.state, fresh.text())
        out.raw(text)
    gauges(out, view.fast(), GAUGES)

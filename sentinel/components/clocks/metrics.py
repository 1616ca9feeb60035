"""The clocks component's families: temperature, power, clocks, performance state, clock-event reasons."""

from __future__ import annotations

from typing import Final

from sentinel.components.clocks.record import THROTTLE_NAMES, VIOLATION_NAMES
from sentinel.components.exposition import (
    Gauge,
    MetricsView,
    Writer,
    gauges,
    keep_block,
    kept_block,
    value_key,
)

GAUGES: Final[tuple[Gauge, ...]] = (
    ("temp_c", "sentinel_gpu_temperature_celsius", "GPU core temperature", 1.0, 1.0),
    ("power_w", "sentinel_gpu_power_watts", "power draw", 1.0, 1.0),
    ("power_limit_w", "sentinel_gpu_power_limit_watts", "enforced power limit", 1.0, 1.0),
    ("sm_clock_mhz", "sentinel_gpu_sm_clock_hertz", "current SM clock", 1e6, 1.0),
    ("sm_clock_max_mhz", "sentinel_gpu_sm_clock_max_hertz", "maximum SM clock", 1e6, 1.0),
    ("mem_clock_mhz", "sentinel_gpu_memory_clock_hertz", "current memory clock", 1e6, 1.0),
    ("pstate", "sentinel_gpu_performance_state", "performance state P0..P15 (0 fastest)", 1.0, 1.0),
)


SLOW_GAUGES: Final[tuple[Gauge, ...]] = (
    ("mem_temp_c", "sentinel_gpu_memory_temperature_celsius", "HBM (memory) temperature", 1.0, 1.0),
)


def render(out: Writer, view: MetricsView) -> None:
    fast = view.fast()
    gauges(out, fast, GAUGES)
    gauges(out, view.slow(), SLOW_GAUGES)
    name = "sentinel_gpu_throttle_reason"
    out.family(name, "gauge", "1 while the clock-event (throttle) reason is active")
    for sample, labels in fast:
        slot, key = (name, labels), tuple(sample.throttle)
        text = kept_block(slot, key)
        if text is None:
            fresh = Writer()
            active = set(sample.throttle)
            for reason in THROTTLE_NAMES:
                fresh.line(name, labels, 1.0 if reason in active else 0.0, f'reason="{reason}"')
            text = keep_block(slot, key, fresh.text())
        out.raw(text)
    name = "sentinel_gpu_clock_violation_seconds_total"
    out.family(
        name, "counter", "time NVML's clock policy held the clocks below target (rate() = share of time)"
    )
    for sample, labels in view.slow():
        violations = sample.violations
        if violations is None:
            continue
        times = [getattr(violations, policy) for policy in VIOLATION_NAMES]
        times_key = tuple(value_key(ns) for ns in times)
        text = kept_block((name, labels), times_key)
        if text is None:
            fresh = Writer()
            for policy, ns in zip(VIOLATION_NAMES, times, strict=True):
                if ns is not None:
                    fresh.line(name, labels, ns / 1e9, f'policy="{policy}"')
            text = keep_block((name, labels), times_key, fresh.text())
        out.raw(text)

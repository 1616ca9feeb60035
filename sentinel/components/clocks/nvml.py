"""Clocks, clock-event reasons, temperature, power and performance state through NVML."""

from __future__ import annotations

from typing import Any

import pynvml

from sentinel.components.clocks.record import VIOLATION_POLICIES, ClockViolations, reason_names
from sentinel.components.nvml_read import Get
from sentinel.wire import GpuSample


def fill(get: Get, gpu: int, h: Any, sample: GpuSample) -> None:
    temp = get(gpu, "temperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    sample.temp_c = float(temp) if temp is not None else None
    power = get(gpu, "power", pynvml.nvmlDeviceGetPowerUsage, h)
    sample.power_w = power / 1000.0 if power is not None else None
    limit = get(gpu, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    sample.power_limit_w = limit / 1000.0 if limit is not None else None
    sm = get(gpu, "sm_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
    sample.sm_clock_mhz = float(sm) if sm is not None else None
    sm_max = get(gpu, "sm_clock_max", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
    sample.sm_clock_max_mhz = float(sm_max) if sm_max is not None else None
    mem_clock = get(gpu, "mem_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
    sample.mem_clock_mhz = float(mem_clock) if mem_clock is not None else None
    reasons = get(gpu, "clock_events", clock_event_reasons, h)
    if reasons is not None:
        sample.throttle = reason_names(reasons)
    pstate = get(gpu, "pstate", pynvml.nvmlDeviceGetPerformanceState, h)
    sample.pstate = int(pstate) if pstate is not None and 0 <= int(pstate) <= 15 else None


def clock_event_reasons(handle: Any) -> int:
    """Newer drivers name them clock events; older ones only have the throttle-reason function."""
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except pynvml.NVMLError as exc:
        if getattr(exc, "value", None) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def read_violations(get: Get, gpu: int, h: Any) -> ClockViolations | None:
    """Every policy's cumulative violation time (slow ticks); a policy NOT_SUPPORTED is remembered and not
    asked again. The reference time is the latest reading's (NVML stamps each answer)."""
    values: dict[str, int] = {}
    reference = 0
    for policy, name in VIOLATION_POLICIES.items():
        answer = get(gpu, f"violation_{name}", pynvml.nvmlDeviceGetViolationStatus, h, policy)
        if answer is None:
            continue
        values[name] = int(answer.violationTime)
        reference = max(reference, int(answer.referenceTime))
    if not values:
        return None
    return ClockViolations(reference_us=reference, **values)

"""Clock-event (throttle) reasons: NVML's bit mask → the names sentinel uses on the wire and in metrics.

The fields themselves (SM/memory clocks, temperature, power, pstate, ``throttle``) ride in
:class:`sentinel.wire.GpuSample`; this module is the one place that names the reasons and groups them.
"""

from __future__ import annotations

from typing import Final

import msgspec

#: clock-event (throttle) reason bits (nvmlClocksEventReason*) → names
THROTTLE_REASONS: Final[dict[int, str]] = {
    0x0000000000000001: "gpu_idle",
    0x0000000000000002: "applications_clocks",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000010: "sync_boost",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
    0x0000000000000100: "display_clocks",
}
THROTTLE_NAMES: Final[tuple[str, ...]] = tuple(THROTTLE_REASONS.values())
#: reasons that slow a GPU because it is hot, or because it is held at its power limit
THERMAL_REASONS: Final = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})
POWER_REASONS: Final = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


#: nvmlPerfPolicyType_t → names: the policies whose violation time NVML counts (nvmlDeviceGetViolationStatus)
VIOLATION_POLICIES: Final[dict[int, str]] = {
    0: "power",  # NVML_PERF_POLICY_POWER: held at the power limit (nvidia-smi's "SW Power Capping" counter)
    1: "thermal",  # NVML_PERF_POLICY_THERMAL
    2: "sync_boost",  # NVML_PERF_POLICY_SYNC_BOOST
    3: "board_limit",  # NVML_PERF_POLICY_BOARD_LIMIT
    4: "low_utilization",  # NVML_PERF_POLICY_LOW_UTILIZATION
    5: "reliability",  # NVML_PERF_POLICY_RELIABILITY
    10: "app_clocks",  # NVML_PERF_POLICY_TOTAL_APP_CLOCKS: below the application clocks, any reason
    11: "base_clocks",  # NVML_PERF_POLICY_TOTAL_BASE_CLOCKS: below the base clock, any reason
}
VIOLATION_NAMES: Final[tuple[str, ...]] = tuple(VIOLATION_POLICIES.values())


class ClockViolations(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Cumulative time each policy held the clocks below target, from ``nvmlDeviceGetViolationStatus``.

    The reason bits (``GpuSample.throttle``) are one instant per tick; violation time is the integral, so a
    GPU that power-caps 60% of the time shows as 0.6 whichever instants the ticks happened to catch.
    ``reference_us`` is NVML's own timestamp of the reading (µs): the fraction of an interval spent
    throttled is Δns / (Δreference_us · 1000), independent of when the agent's tick ran.
    """

    reference_us: int
    #: cumulative violation time per policy, ns (None: this GPU does not report the policy)
    power: int | None = None
    thermal: int | None = None
    sync_boost: int | None = None
    board_limit: int | None = None
    low_utilization: int | None = None
    reliability: int | None = None
    app_clocks: int | None = None
    base_clocks: int | None = None

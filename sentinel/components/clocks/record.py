"""Clock-event (throttle) reasons: NVML's bit mask → the names sentinel uses on the wire and in metrics.

The fields themselves (SM/memory clocks, temperature, power, pstate, ``throttle``) ride in
:class:`sentinel.wire.GpuSample`; this module is the one place that names the reasons and groups them.
"""

from __future__ import annotations

from typing import Final

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

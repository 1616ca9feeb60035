"""Judge a scenario's report against its faults: time to verdict per fault, and the verdicts no fault explains.

Shared by tests/sim/test_severities.py (which asserts on it) and bench/fault_table.py (which prints it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.components.xid.catalog import APPLICATION_CODES
from sentinel.sim.runner import run_scenario
from sentinel.sim.scenario import FaultSpec, load_scenario

HARDWARE_S, HANG_S, STRAGGLER_S, SILENT_S = 3.0, 10.0, 60.0, 15.0
SMALL_STRAGGLER_S = 120.0  # the bound is for 1.2x and more; a 1.1x straggler gets twice as long

#: fault kind → (verdict kinds that name it correctly, bound in seconds)
EXPECTED: dict[str, tuple[frozenset[str], float]] = {
    "gpu_lost": (frozenset({"faulty"}), HARDWARE_S),
    "nvml_hang": (frozenset({"faulty"}), HARDWARE_S),
    "row_remap_pending": (frozenset({"degraded", "faulty"}), HARDWARE_S),
    "row_remap_failure": (frozenset({"faulty"}), HARDWARE_S),
    "ecc_uncorrectable": (frozenset({"faulty"}), HARDWARE_S),
    "nvlink_errors": (frozenset({"degraded", "faulty"}), HARDWARE_S),
    "thermal_throttle": (frozenset({"straggler"}), STRAGGLER_S),
    "straggler": (frozenset({"straggler"}), STRAGGLER_S),
    "hang": (frozenset({"stuck"}), HANG_S),
    "nccl_net_error": (frozenset({"stuck"}), HANG_S),
    "host_down": (frozenset({"host_silent"}), SILENT_S),
    "sxid_fatal": (frozenset({"faulty"}), HARDWARE_S),
    "xid_recurring": (frozenset({"faulty"}), HARDWARE_S),
}


def expected(fault: FaultSpec) -> tuple[frozenset[str], float] | None:
    """What must name ``fault`` and how soon; None when nothing may (an application Xid)."""
    if fault.kind == "xid":
        return None if fault.xid in APPLICATION_CODES else (frozenset({"faulty"}), HARDWARE_S)
    if fault.kind == "xid_storm":
        return None  # a storm is one informational verdict on its origin, never a GPU's fault
    return EXPECTED[fault.kind]


def names(verdict: dict[str, Any], fault: FaultSpec) -> bool:
    if verdict["host"] != fault.host:
        return False
    return fault.gpu is None or verdict["gpu"] == fault.gpu


def explained(verdict: dict[str, Any], faults: list[FaultSpec]) -> bool:
    """A verdict is true when it names a faulted GPU (or, for a host verdict, a host-wide fault's host).

    A GPU verdict under a host-wide fault is false: a slow host is one host verdict, not one per GPU. A
    stuck verdict on the GPU of a fault that kills the process (Xid 79) is the same fault seen by the job.
    """
    for fault in faults:
        storm = fault.kind == "xid_storm" and verdict["reason"] == "xid_storm" and verdict["action"] == "none"
        if storm and verdict["host"] in (fault.hosts or []):
            return True
        if expected(fault) is None or verdict["host"] != fault.host:
            continue
        if fault.gpu is None and verdict["gpu"] is None:
            return True
        if fault.gpu is not None and verdict["gpu"] == fault.gpu:
            return True
    return False


@dataclass(frozen=True)
class Row:
    scenario: str
    fault: str
    severity: str
    delay_s: float | None  # None: never found
    bound_s: float
    false_verdicts: int


def _severity(fault: FaultSpec) -> str:
    for name in ("slowdown", "clock_mhz", "xid", "count", "rate_per_s"):
        value = getattr(fault, name)
        if value is not None:
            return {"slowdown": f"{value:g}x", "clock_mhz": f"{value:g} MHz", "xid": f"Xid {value}"}.get(
                name, f"{name} {value:g}"
            )
    return "host-wide" if fault.gpu is None else "-"


def judge(path: Path) -> list[Row]:
    scenario = load_scenario(path)
    verdicts = run_scenario(scenario).report()["verdicts"]
    false = sum(1 for v in verdicts if not explained(v, scenario.faults))
    rows = []
    for fault in scenario.faults:
        want = expected(fault)
        if want is None:
            continue
        kinds, bound = want
        if fault.kind == "straggler" and fault.slowdown is not None and fault.slowdown < 1.2:
            bound = SMALL_STRAGGLER_S  # under 1.2x the ±20% jitter needs more steps to be outgrown
        hits = [v["t_s"] - fault.at_s for v in verdicts if names(v, fault) and v["kind"] in kinds]
        where = f"{fault.kind} {fault.host}" + (f"/{fault.gpu}" if fault.gpu is not None else "")
        rows.append(Row(path.stem, where, _severity(fault), min(hits) if hits else None, bound, false))
    if not rows:
        rows.append(Row(path.stem, "none (healthy)", "-", None, 0.0, false))
    return rows

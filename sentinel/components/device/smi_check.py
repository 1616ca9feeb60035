"""``scripts/gpu-check``: sentinel's NVML readings next to ``nvidia-smi -q -x`` on a real GPU host.

Every field both report is printed with both values; a difference is flagged. Identity fields (UUID, PCI
address, VBIOS, driver, serial, link width) must match exactly; readings that move between the two reads
(utilisation, power, temperature, clocks) within a tolerance. nvidia-smi is another NVML client, so a
difference points at sentinel's read (a wrong unit, a swapped field) — the point of running this once on
each new GPU generation or driver.

The clock-event reasons (active or not) and the power / sync-boost violation time are compared too, where
the driver's nvidia-smi reports them. NVLink error counters are not in ``nvidia-smi -q -x`` (only in
``nvidia-smi nvlink -e``), so they are not compared here.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Row:
    gpu: int
    field: str
    sentinel: str
    smi: str
    differs: bool


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    match = _NUMBER.search(text)
    return float(match.group()) if match else None


def _pci(text: str | None) -> str:
    """``00000000:18:00.0`` → ``0000:18:00`` (what sentinel reports)."""
    if not text:
        return ""
    parts = text.strip().lower().split(".")[0].split(":")
    return f"{parts[0][-4:]}:{parts[1]}:{parts[2]}" if len(parts) == 3 else text.lower()


def _find(node: ET.Element, path: str) -> str | None:
    """The text at ``path`` (``a|b``: the first present, for element names that differ between driver
    generations); None when absent or N/A."""
    for alternative in path.split("|"):
        found = node.find(alternative)
        if found is None or found.text is None:
            continue
        text = found.text.strip()
        return None if text in ("N/A", "", "Not Supported", "[N/A]") else text
    return None


#: (field, sentinel getter over (inventory entry, sample), nvidia-smi path, kind, tolerance)
Spec = tuple[str, Any, str, str, float]
SPECS: tuple[Spec, ...] = (
    ("uuid", lambda i, s: i.get("uuid"), "uuid", "text", 0),
    ("name", lambda i, s: i.get("name"), "product_name", "text", 0),
    ("pci_bus", lambda i, s: i.get("pci_bus"), "pci/pci_bus_id", "pci", 0),
    ("serial", lambda i, s: i.get("serial"), "serial", "text", 0),
    ("vbios", lambda i, s: i.get("vbios"), "vbios_version", "text", 0),
    ("memory_total_mib", lambda i, s: (i.get("memory_total_bytes") or 0) / 2**20 or None, "fb_memory_usage/total", "num", 0.01),
    ("util_gpu_pct", lambda i, s: s.get("util_gpu_pct"), "utilization/gpu_util", "num", 25),
    ("temp_c", lambda i, s: s.get("temp_c"), "temperature/gpu_temp", "num", 3),
    ("mem_temp_c", lambda i, s: s.get("mem_temp_c"), "temperature/memory_temp", "num", 3),
    ("power_w", lambda i, s: s.get("power_w"), "gpu_power_readings/power_draw|gpu_power_readings/average_power_draw|power_readings/power_draw", "rel", 0.15),
    ("power_limit_w", lambda i, s: s.get("power_limit_w"), "gpu_power_readings/current_power_limit|power_readings/enforced_power_limit", "rel", 0.01),
    ("sm_clock_mhz", lambda i, s: s.get("sm_clock_mhz"), "clocks/sm_clock", "rel", 0.2),
    ("sm_clock_max_mhz", lambda i, s: s.get("sm_clock_max_mhz"), "max_clocks/sm_clock", "num", 0),
    ("mem_clock_mhz", lambda i, s: s.get("mem_clock_mhz"), "clocks/mem_clock", "rel", 0.2),
    ("pstate", lambda i, s: s.get("pstate"), "performance_state", "num", 0),
    ("pcie_gen", lambda i, s: (s.get("pcie_link") or {}).get("gen"), "pci/pci_gpu_link_info/pcie_gen/current_link_gen", "num", 0),
    ("pcie_gen_max", lambda i, s: (s.get("pcie_link") or {}).get("gen_max"), "pci/pci_gpu_link_info/pcie_gen/max_link_gen", "num", 0),
    ("pcie_width", lambda i, s: (s.get("pcie_link") or {}).get("width"), "pci/pci_gpu_link_info/link_widths/current_link_width", "num", 0),
    ("pcie_width_max", lambda i, s: (s.get("pcie_link") or {}).get("width_max"), "pci/pci_gpu_link_info/link_widths/max_link_width", "num", 0),
    ("pcie_replay", lambda i, s: s.get("pcie_replay"), "pci/replay_counter", "num", 0),
    ("remapped_rows_correctable", lambda i, s: (s.get("remap") or {}).get("correctable"), "remapped_rows/remapped_row_corr", "num", 0),
    ("remapped_rows_uncorrectable", lambda i, s: (s.get("remap") or {}).get("uncorrectable"), "remapped_rows/remapped_row_unc", "num", 0),
    ("fabric_clique", lambda i, s: (s.get("fabric") or {}).get("clique_id"), "fabric/cliqueId", "num", 0),
)  # fmt: skip


def _differs(kind: str, ours: Any, theirs: str, tolerance: float) -> bool:
    if kind == "text":
        return str(ours).strip() != theirs.strip()
    if kind == "pci":
        return str(ours) != _pci(theirs)
    a, b = float(ours), _num(theirs)
    if b is None:
        return True
    if kind == "rel":
        return abs(a - b) > tolerance * max(abs(b), 1.0)
    return abs(a - b) > tolerance


def compare(once: dict[str, Any], smi_xml: str) -> list[Row]:
    """Rows for every field both sides report, GPU by GPU (matched by PCI address, else by order)."""
    root = ET.fromstring(smi_xml)  # noqa: S314
    smi_gpus = root.findall("gpu")
    by_bus = {_pci(g.get("id")): g for g in smi_gpus}
    samples = {s.get("gpu"): s for s in once.get("samples", [])}
    rows: list[Row] = []
    driver = _find(root, "driver_version")
    for position, info in enumerate(once.get("inventory", [])):
        index = int(info.get("index", position))
        node = by_bus.get(info.get("pci_bus", "")) or (
            smi_gpus[position] if position < len(smi_gpus) else None
        )
        if node is None:
            rows.append(Row(index, "present", "yes", "missing in nvidia-smi", True))
            continue
        if driver is not None and info.get("driver"):
            rows.append(Row(index, "driver", info["driver"], driver, info["driver"] != driver))
        sample = samples.get(index, {})
        for name, getter, path, kind, tolerance in SPECS:
            ours = getter(info, sample)
            theirs = _find(node, path)
            if ours is None or ours == "" or theirs is None:
                continue
            rows.append(Row(index, name, str(ours), theirs, _differs(kind, ours, theirs, tolerance)))
        unsupported = set(once.get("unsupported", []))
        if sample:  # (a GPU without a sample — unreachable, lost — has no reasons to compare)
            rows += _clock_events(index, sample, node, unsupported)
    if len(smi_gpus) != len(once.get("inventory", [])):
        rows.append(Row(-1, "gpu_count", str(len(once.get("inventory", []))), str(len(smi_gpus)), True))
    return rows


#: sentinel's clock-event reason → nvidia-smi's tag (``clocks_event_reason_<tag>``; before R535 the same under
#: ``clocks_throttle_reasons/clocks_throttle_reason_<tag>``)
REASON_TAGS: dict[str, str] = {
    "gpu_idle": "gpu_idle",
    "applications_clocks": "applications_clocks_setting",
    "sw_power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal_slowdown",
    "hw_thermal_slowdown": "hw_thermal_slowdown",
    "hw_power_brake_slowdown": "hw_power_brake_slowdown",
    "display_clocks": "display_clocks_setting",
}
#: sentinel's violation policy → nvidia-smi's clock-event counter (µs; R550+): the same NVML counter
#: (NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP is NVML_FI_DEV_PERF_POLICY_POWER). Thermal is not
#: compared: nvidia-smi splits it into SW and HW slowdown, NVML's thermal policy is one counter.
VIOLATION_TAGS: dict[str, str] = {"power": "sw_power_cap", "sync_boost": "sync_boost"}
#: seconds a cumulative counter may advance between sentinel's read and nvidia-smi's
VIOLATION_TOLERANCE_S = 10.0


def _clock_events(index: int, sample: dict[str, Any], node: ET.Element, unsupported: set[str]) -> list[Row]:
    rows: list[Row] = []
    if f"{index}:clock_events" not in unsupported:
        active = set(sample.get("throttle") or [])
        for name, tag in REASON_TAGS.items():
            theirs = _find(node, f"clocks_event_reasons/clocks_event_reason_{tag}") or _find(
                node, f"clocks_throttle_reasons/clocks_throttle_reason_{tag}"
            )
            if theirs is None:
                continue
            ours = "active" if name in active else "not active"
            rows.append(Row(index, f"clock_event.{name}", ours, theirs, ours != theirs.strip().lower()))
    violations = sample.get("violations") or {}
    for policy, tag in VIOLATION_TAGS.items():
        ns = violations.get(policy)
        theirs = _find(node, f"clocks_event_reasons_counters/clocks_event_reasons_counters_{tag}")
        if ns is None or theirs is None:
            continue
        us = _num(theirs)
        ours_s, theirs_s = ns / 1e9, (us / 1e6 if us is not None else None)
        differs = theirs_s is None or abs(ours_s - theirs_s) > VIOLATION_TOLERANCE_S
        rows.append(Row(index, f"clock_violation_s.{policy}", f"{ours_s:.3f}", theirs, differs))
    return rows


def render(rows: list[Row]) -> str:
    lines = [f"{'gpu':>3}  {'field':<28} {'sentinel':<40} {'nvidia-smi':<40} ", "-" * 118]
    for r in rows:
        flag = "DIFFERS" if r.differs else ""
        lines.append(f"{r.gpu:>3}  {r.field:<28} {r.sentinel[:40]:<40} {r.smi[:40]:<40} {flag}")
    bad = sum(r.differs for r in rows)
    lines.append(f"{len(rows)} fields compared, {bad} differ")
    return "\n".join(lines) + "\n"

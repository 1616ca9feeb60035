"""One GPU as ``nvidia-smi -q -x`` prints it, made from the agent's own NVML reads (the reverse of
:mod:`sentinel.agent.nvml.replay`, which turns such a document into NVML answers).

Incident evidence wants the GPU's state as nvidia-smi shows it, but running nvidia-smi (or a fresh NVML
call) on a GPU that just failed can hang. The snapshot is built from what the per-GPU deadline workers last
read — identity from the inventory, the latest fast sample and the latest sample with the slow counters —
with nvidia-smi's element names and units, so it reads like ``nvidia-smi -q -x`` (and parses with the same
reader). Values the agent did not read are absent rather than guessed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable

from sentinel.wire import GpuInfo, GpuSample

_MIB = 1024 * 1024


def _mib(n: int) -> str:
    return f"{n // _MIB} MiB"


def _put(parent: ET.Element, path: str, value: str | None) -> None:
    if value is None:
        return
    node = parent
    for part in path.split("/"):
        child = node.find(part)
        node = child if child is not None else ET.SubElement(node, part)
    node.text = value


def _fmt(value: float | int | None, render: Callable[[float], str]) -> str | None:
    return None if value is None else render(float(value))


def gpu_element(info: GpuInfo, fast: GpuSample | None, slow: GpuSample | None) -> ET.Element:
    """The ``<gpu>`` element of ``nvidia-smi -q -x`` for one GPU, from its identity and latest samples."""
    gpu = ET.Element("gpu", {"id": info.pci_bus.upper() if info.pci_bus else str(info.index)})
    _put(gpu, "minor_number", str(info.index))
    _put(gpu, "product_name", info.name or None)
    _put(gpu, "serial", info.serial or None)
    _put(gpu, "uuid", info.uuid or None)
    _put(gpu, "vbios_version", info.vbios or None)
    _put(gpu, "pci/pci_bus_id", info.pci_bus.upper() if info.pci_bus else None)
    if info.memory_total_bytes:
        _put(gpu, "fb_memory_usage/total", _mib(info.memory_total_bytes))
    if info.error:
        _put(gpu, "sentinel_nvml_error", info.error)
    if fast is not None:
        _put(gpu, "sentinel_state", fast.state)
        if fast.mem_total_bytes is not None:
            _put(gpu, "fb_memory_usage/total", _mib(fast.mem_total_bytes))
        if fast.mem_used_bytes is not None:
            _put(gpu, "fb_memory_usage/used", _mib(fast.mem_used_bytes))
        if fast.mem_total_bytes is not None and fast.mem_used_bytes is not None:
            _put(gpu, "fb_memory_usage/free", _mib(fast.mem_total_bytes - fast.mem_used_bytes))
        _put(gpu, "performance_state", None if fast.pstate is None else f"P{fast.pstate}")
        if fast.throttle:
            reasons = ET.SubElement(gpu, "clocks_event_reasons")
            for reason in fast.throttle:
                ET.SubElement(reasons, f"clocks_event_reason_{reason}").text = "Active"
        _put(gpu, "pci/replay_counter", None if fast.pcie_replay is None else str(fast.pcie_replay))
        _put(gpu, "pci/tx_util", _fmt(fast.pcie_tx_kbps, lambda v: f"{v:.0f} KB/s"))
        _put(gpu, "pci/rx_util", _fmt(fast.pcie_rx_kbps, lambda v: f"{v:.0f} KB/s"))
        _put(gpu, "utilization/gpu_util", _fmt(fast.util_gpu_pct, lambda v: f"{v:.0f} %"))
        _put(gpu, "utilization/memory_util", _fmt(fast.util_mem_pct, lambda v: f"{v:.0f} %"))
        _put(gpu, "temperature/gpu_temp", _fmt(fast.temp_c, lambda v: f"{v:.0f} C"))
        _put(gpu, "gpu_power_readings/power_draw", _fmt(fast.power_w, lambda v: f"{v:.2f} W"))
        _put(gpu, "gpu_power_readings/current_power_limit", _fmt(fast.power_limit_w, lambda v: f"{v:.2f} W"))
        _put(gpu, "clocks/sm_clock", _fmt(fast.sm_clock_mhz, lambda v: f"{v:.0f} MHz"))
        _put(gpu, "clocks/mem_clock", _fmt(fast.mem_clock_mhz, lambda v: f"{v:.0f} MHz"))
        _put(gpu, "max_clocks/sm_clock", _fmt(fast.sm_clock_max_mhz, lambda v: f"{v:.0f} MHz"))
        _put(gpu, "recovery_action", fast.recovery_action)
        if fast.pids:
            procs = ET.SubElement(gpu, "processes")
            for pid in fast.pids:
                proc = ET.SubElement(procs, "process_info")
                ET.SubElement(proc, "pid").text = str(pid)
                ET.SubElement(proc, "type").text = "C"
    if slow is not None:
        _slow(gpu, slow)
    return gpu


def _slow(gpu: ET.Element, slow: GpuSample) -> None:
    _put(gpu, "temperature/memory_temp", _fmt(slow.mem_temp_c, lambda v: f"{v:.0f} C"))
    if slow.ecc is not None:
        ecc = slow.ecc
        for path, value in (
            ("ecc_errors/volatile/dram_uncorrectable", ecc.volatile_dram_uncorrected),
            ("ecc_errors/volatile/sram_uncorrectable", ecc.volatile_sram_uncorrected),
            ("ecc_errors/aggregate/dram_uncorrectable", ecc.dram_uncorrected),
            ("ecc_errors/aggregate/sram_uncorrectable", ecc.sram_uncorrected),
            ("ecc_errors/volatile/total_correctable", ecc.volatile_corrected),
            ("ecc_errors/volatile/total_uncorrectable", ecc.volatile_uncorrected),
            ("ecc_errors/aggregate/total_correctable", ecc.aggregate_corrected),
            ("ecc_errors/aggregate/total_uncorrectable", ecc.aggregate_uncorrected),
        ):
            _put(gpu, path, None if value is None else str(value))
    if slow.remap is not None:
        remap = slow.remap
        _put(
            gpu,
            "remapped_rows/remapped_row_corr",
            None if remap.correctable is None else str(remap.correctable),
        )
        _put(
            gpu,
            "remapped_rows/remapped_row_unc",
            None if remap.uncorrectable is None else str(remap.uncorrectable),
        )
        _put(gpu, "remapped_rows/remapped_row_pending", "Yes" if remap.pending else "No")
        _put(gpu, "remapped_rows/remapped_row_failure", "Yes" if remap.failure else "No")
    if slow.pcie_link is not None:
        link = slow.pcie_link
        for path, value in (
            ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", link.gen),
            ("pci/pci_gpu_link_info/pcie_gen/max_link_gen", link.gen_max),
            ("pci/pci_gpu_link_info/link_widths/current_link_width", link.width),
            ("pci/pci_gpu_link_info/link_widths/max_link_width", link.width_max),
        ):
            _put(gpu, path, None if value is None else (f"{value}x" if "width" in path else str(value)))
    if slow.fabric is not None:
        _put(gpu, "fabric/state", str(slow.fabric.state))


def snapshot_xml(
    info: GpuInfo, fast: GpuSample | None, slow: GpuSample | None, *, driver: str = "", timestamp: str = ""
) -> str:
    """A whole ``nvidia_smi_log`` document holding this one GPU (UTF-8 text)."""
    root = ET.Element("nvidia_smi_log")
    _put(root, "timestamp", timestamp or None)
    _put(root, "driver_version", driver or info.driver or None)
    _put(root, "attached_gpus", "1")
    root.append(gpu_element(info, fast, slow))
    return ET.tostring(root, encoding="unicode")

"""A GPU's identity, utilisation, memory, processes and the driver's recovery action, through NVML."""

from __future__ import annotations

from typing import Any, Final

import pynvml

from sentinel.components.device.record import GpuInfo
from sentinel.components.nvml_read import FieldAnswers, FieldRequest, Get
from sentinel.wire import GpuSample

#: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values → names (nvmlDeviceGpuRecoveryAction_t)
RECOVERY_ACTIONS: Final[dict[int, str]] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
FI_RECOVERY_ACTION: Final = int(getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230))


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def normalize_pci_bus(bus_id: str) -> str:
    """NVML's ``00000000:1B:00.0`` → the contract's ``0000:1b:00`` (4-digit domain, no function, lower)."""
    lowered = bus_id.strip().lower()
    if "." in lowered:
        lowered = lowered.rsplit(".", 1)[0]
    parts = lowered.split(":")
    if len(parts) == 3:
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1][-2:].rjust(2, '0')}:{parts[2][-2:].rjust(2, '0')}"
    return lowered


def identity(get: Get, index: int, handle: Any, driver: str, nvlinks: int) -> GpuInfo:
    uuid = text(get(index, "uuid", pynvml.nvmlDeviceGetUUID, handle) or "")
    pci = get(index, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
    name = text(get(index, "name", pynvml.nvmlDeviceGetName, handle) or "")
    serial = text(get(index, "serial", pynvml.nvmlDeviceGetSerial, handle) or "")
    vbios = text(get(index, "vbios", pynvml.nvmlDeviceGetVbiosVersion, handle) or "")
    memory = get(index, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
    return GpuInfo(
        index=index,
        uuid=uuid,
        pci_bus=normalize_pci_bus(text(pci.busId)) if pci is not None else "",
        name=name,
        serial=serial,
        driver=driver,
        vbios=vbios,
        memory_total_bytes=int(memory.total) if memory is not None else 0,
        nvlinks=nvlinks,
    )


def fill(get: Get, gpu: int, h: Any, sample: GpuSample) -> None:
    """Utilisation, framebuffer memory and the compute processes (pid → job mapping starts here)."""
    util = get(gpu, "utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
    if util is not None:
        sample.util_gpu_pct = float(util.gpu)
        sample.util_mem_pct = float(util.memory)
    memory = get(gpu, "memory", pynvml.nvmlDeviceGetMemoryInfo, h)
    if memory is not None:
        sample.mem_used_bytes = int(memory.used)
        sample.mem_total_bytes = int(memory.total)
    procs = get(gpu, "processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h)
    if procs is not None:
        sample.pids = sorted({int(p.pid) for p in procs})


FI_MEMORY_TEMP: Final = int(getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", 82))
#: the device-wide field values this component reads, in the GPU's one field-values call (slow ticks)
FIELDS: Final[list[FieldRequest]] = [
    ("recovery_action", FI_RECOVERY_ACTION, 0),
    ("memory_temperature", FI_MEMORY_TEMP, 0),
]


def fill_fields(values: FieldAnswers, sample: GpuSample) -> None:
    """The driver's recovery action (R550+) and the HBM temperature, from the GPU's field values."""
    recovery = values.get("recovery_action")
    if recovery is not None:
        code = int(recovery)
        sample.recovery_action = RECOVERY_ACTIONS.get(code, f"unknown_{code}")
    temperature = values.get("memory_temperature")
    if temperature is not None:
        sample.mem_temp_c = float(temperature)

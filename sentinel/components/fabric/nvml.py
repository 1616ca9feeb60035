"""Fabric registration through NVML (``nvmlDeviceGetGpuFabricInfo``, R535+; NOT_SUPPORTED without NVSwitch)."""

from __future__ import annotations

import uuid
from typing import Any, Final

import pynvml

from sentinel.components.fabric.record import FabricInfo, FabricState
from sentinel.components.nvml_read import Get

_STATES: Final[dict[int, FabricState]] = {
    int(pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED): "not_supported",
    int(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED): "not_started",
    int(pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS): "in_progress",
    int(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED): "completed",
}


def _fabric_info(h: Any) -> Any:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(h, pynvml.byref(info))
    return info


def _fabric_info_v(h: Any) -> Any:
    """The versioned call (R550+), which adds the health mask; FUNCTION_NOT_FOUND on older drivers."""
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    info.version = pynvml.nvmlGpuFabricInfo_v3
    pynvml.nvmlDeviceGetGpuFabricInfoV(h, pynvml.byref(info))
    return info


def read(get: Get, gpu: int, h: Any) -> FabricInfo | None:
    info = get(gpu, "fabric_v", _fabric_info_v, h)
    health: int | None = int(info.healthMask) if info is not None else None
    if info is None:
        info = get(gpu, "fabric", _fabric_info, h)
    if info is None:
        return None
    state = _STATES.get(int(info.state), "not_supported")
    if state == "not_supported":
        return None
    return FabricInfo(
        state=state,
        status=int(info.status),
        clique_id=int(info.cliqueId),
        cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
        health_mask=health,
    )

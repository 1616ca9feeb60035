"""The fake NVML's answer to the fabric_health read: ``nvmlDeviceGetGpuFabricInfoV`` with the fake GPU's
``fabric`` and its ``extra["fabric_health"]`` mask (absent: a driver before R550, the v1 call only)."""

from __future__ import annotations

import types

import pynvml

from tests.agent.fakenvml import FUNCTION_NOT_FOUND, NOT_SUPPORTED, SUCCESS, Device, FakeGpu, P

#: the reads the fake GPUs of other folders' tests answer NOT_SUPPORTED (``agent once``'s "unsupported")
UNSUPPORTED_BY_DEFAULT = ("fabric_v",)


def install(lib: types.SimpleNamespace, device: Device) -> None:
    def fabric_v(gpu: FakeGpu, out: int) -> int:
        if gpu.fabric is None:
            return NOT_SUPPORTED
        mask = gpu.extra.get("fabric_health")
        if mask is None:
            return FUNCTION_NOT_FOUND
        info = pynvml.c_nvmlGpuFabricInfo_v3_t.from_address(out)
        info.state, info.status, info.cliqueId = gpu.fabric
        info.healthMask = mask
        return SUCCESS

    lib.nvmlDeviceGetGpuFabricInfoV = device("nvmlDeviceGetGpuFabricInfoV", fabric_v, P)

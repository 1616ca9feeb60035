"""The fake NVML's answer to the hbm read: ``nvmlDeviceGetTemperatureThreshold(MEM_MAX)`` from the fake
GPU's ``extra["mem_temp_max"]`` (absent: NOT_SUPPORTED)."""

from __future__ import annotations

import types
from ctypes import c_uint

import pynvml

from tests.agent.fakenvml import NOT_SUPPORTED, SUCCESS, Device, FakeGpu, P

#: the reads the fake GPUs of other folders' tests answer NOT_SUPPORTED (``agent once``'s "unsupported")
UNSUPPORTED_BY_DEFAULT = ("mem_temp_max",)


def install(lib: types.SimpleNamespace, device: Device) -> None:
    def threshold(gpu: FakeGpu, kind: int, out: int) -> int:
        limit = gpu.extra.get("mem_temp_max")
        if kind != pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX or limit is None:
            return NOT_SUPPORTED
        c_uint.from_address(out).value = limit
        return SUCCESS

    lib.nvmlDeviceGetTemperatureThreshold = device("nvmlDeviceGetTemperatureThreshold", threshold, c_uint, P)

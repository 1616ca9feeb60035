"""The HBM temperature limit through NVML: the memory's maximum operating temperature (slow ticks)."""

from __future__ import annotations

from typing import Any, Final

import pynvml

from sentinel.components.signal import SlowRead, put_reading
from sentinel.wire import GpuSample

MEM_MAX: Final = int(getattr(pynvml, "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", 5))
#: the limit's key in the sample's ``readings``
LIMIT: Final = "hbm.mem_temp_max_c"


def _limit(h: Any) -> int:
    return int(pynvml.nvmlDeviceGetTemperatureThreshold(h, MEM_MAX))


def read(read: SlowRead, sample: GpuSample) -> None:
    """``None`` where NVML does not report the limit (remembered: not asked again) or reports 0."""
    limit = read.get(read.gpu, "mem_temp_max", _limit, read.handle)
    put_reading(sample, LIMIT, float(limit) if limit else None)

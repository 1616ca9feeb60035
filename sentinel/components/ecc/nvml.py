"""ECC counters and retired pages through NVML."""

from __future__ import annotations

from typing import Any

import msgspec
import pynvml

from sentinel.components.ecc.record import EccCounters, RetiredPages
from sentinel.components.nvml_read import Get


def read_ecc(get: Get, gpu: int, h: Any) -> EccCounters | None:
    """Volatile and aggregate totals, and uncorrected errors by location where the GPU splits them."""
    fn = pynvml.nvmlDeviceGetTotalEccErrors
    corrected, uncorrected = (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    )
    volatile, aggregate = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    values = {
        "volatile_corrected": get(gpu, "ecc_vc", fn, h, corrected, volatile),
        "volatile_uncorrected": get(gpu, "ecc_vu", fn, h, uncorrected, volatile),
        "aggregate_corrected": get(gpu, "ecc_ac", fn, h, corrected, aggregate),
        "aggregate_uncorrected": get(gpu, "ecc_au", fn, h, uncorrected, aggregate),
    }
    location = pynvml.nvmlDeviceGetMemoryErrorCounter
    sram, dram = pynvml.NVML_MEMORY_LOCATION_SRAM, pynvml.NVML_MEMORY_LOCATION_DRAM
    values["sram_uncorrected"] = get(gpu, "ecc_sram", location, h, uncorrected, aggregate, sram)
    values["dram_uncorrected"] = get(gpu, "ecc_dram", location, h, uncorrected, aggregate, dram)
    if all(v is None for v in values.values()):
        return None
    counts: dict[str, int] = {k: int(v) for k, v in values.items() if v is not None}
    return msgspec.convert(counts, EccCounters)


def read_retired(get: Get, gpu: int, h: Any) -> RetiredPages | None:
    """Pre-Ampere page retirement; ``None`` on GPUs that remap rows instead (NOT_SUPPORTED)."""
    fn = pynvml.nvmlDeviceGetRetiredPages
    single = get(gpu, "retired_sbe", fn, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = get(gpu, "retired_dbe", fn, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = get(gpu, "retired_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if single is None and double is None and pending is None:
        return None
    return RetiredPages(
        single_bit=len(single or []), double_bit=len(double or []), pending=bool(pending or 0)
    )

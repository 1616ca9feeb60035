"""Row remapping through NVML: the remapped-row counters and the bank-availability histogram."""

from __future__ import annotations

from typing import Any

import pynvml

from sentinel.components.nvml_read import Get
from sentinel.components.rowremap.record import RowRemap


def read(get: Get, gpu: int, handle: Any) -> RowRemap | None:
    """``None`` when the GPU has no row remapper (pre-Ampere: see the ECC component's retired pages)."""
    rows = get(gpu, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows, handle)
    if rows is None:
        return None
    correctable, uncorrectable, pending, failure = rows  # NVML's documented order
    hist = get(gpu, "remap_histogram", pynvml.nvmlDeviceGetRowRemapperHistogram, handle)
    extra: dict[str, int] = {}
    if hist is not None:
        extra = {
            "hist_max": int(hist.max),
            "hist_high": int(hist.high),
            "hist_partial": int(hist.partial),
            "hist_low": int(hist.low),
            "hist_none": int(hist.none),
        }
    return RowRemap(
        correctable=int(correctable),
        uncorrectable=int(uncorrectable),
        pending=bool(pending),
        failure=bool(failure),
        **extra,
    )

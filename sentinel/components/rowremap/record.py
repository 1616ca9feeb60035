"""The row-remap record: the same struct in ``GpuSample.remap`` on the wire, in the rule and in metrics."""

from __future__ import annotations

import msgspec


class RowRemap(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``nvmlDeviceGetRemappedRows`` and the row-remapper histogram (bank availability).

    Counts are ``None`` where the source did not say (an ``nvidia-smi`` excerpt with ``N/A``); NVML always
    gives all four. Correctable and uncorrectable are separately named end to end, so nobody has to
    remember NVML's tuple order (:func:`sentinel.components.rowremap.nvml.read` reads it once).
    """

    correctable: int | None = 0
    uncorrectable: int | None = 0
    pending: bool = False
    failure: bool = False
    hist_max: int | None = None
    hist_high: int | None = None
    hist_partial: int | None = None
    hist_low: int | None = None
    hist_none: int | None = None

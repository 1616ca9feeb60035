"""The ECC and retired-page records: the same structs on the wire (``GpuSample.ecc`` / ``.retired``), in the
rules and in the metrics. ``None`` wherever the GPU (or an ``nvidia-smi`` excerpt's ``N/A``) does not say.
"""

from __future__ import annotations

import msgspec


class EccCounters(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """NVML ECC error counters.

    *volatile* counts since the last driver load / GPU reset, *aggregate* over the board's life (InfoROM);
    Ampere and later split uncorrected errors by location (SRAM cannot be remapped, DRAM rows can).
    """

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    volatile_sram_uncorrected: int | None = None
    volatile_dram_uncorrected: int | None = None
    sram_uncorrected: int | None = None  # aggregate, where NVML splits SRAM/DRAM
    dram_uncorrected: int | None = None
    #: nvidia-smi "SRAM Threshold Exceeded" (Hopper+): the driver's own RMA hint.
    sram_threshold_exceeded: bool | None = None


class RetiredPages(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Pre-Ampere dynamic page retirement (``nvmlDeviceGetRetiredPages`` / pending status)."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None

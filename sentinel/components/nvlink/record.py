"""The NVLink record: one per link, on the wire in ``GpuSample.nvlink``."""

from __future__ import annotations

import msgspec


class NvLink(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Per-link state and cumulative error counters."""

    link: int
    active: bool = True
    crc_errors: int = 0
    replay_errors: int = 0
    recovery_errors: int = 0

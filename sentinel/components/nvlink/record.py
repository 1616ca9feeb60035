"""The NVLink record: one per link, on the wire in ``GpuSample.nvlink``.

Every counter is what NVML answered, cumulative since the driver loaded; ``None`` where this GPU's NVML does
not report it (Blackwell dropped the data-link CRC/replay/recovery counters and reports symbol and effective
errors with their bit-error rates instead; Hopper and older have only the former).
"""

from __future__ import annotations

import msgspec


class NvLink(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Per-link state and cumulative error counters."""

    link: int
    active: bool = True
    #: data-link CRC errors in flow-control units (flits): a marginal link, each one costs a replay
    crc_errors: int | None = None
    #: data-link CRC errors in data packets (NVML reports them for links 0-11 only)
    crc_data_errors: int | None = None
    #: packets retransmitted by the data link
    replay_errors: int | None = None
    #: link recoveries (the link retrained: traffic stalls meanwhile)
    recovery_errors: int | None = None
    #: Blackwell: received symbols in error before forward error correction (corrected; many are normal)
    symbol_errors: int | None = None
    #: Blackwell: errors left after forward error correction (replayed: these cost bandwidth)
    effective_errors: int | None = None
    #: Blackwell: link recoveries that failed (the link went down)
    recovery_failed: int | None = None
    #: Blackwell: bit-error rates, decoded from NVML's mantissa/exponent encoding
    symbol_ber: float | None = None
    effective_ber: float | None = None


#: counters (attribute, metric ``type`` label) in the order the metrics and the evidence name them
COUNTERS: tuple[tuple[str, str], ...] = (
    ("crc_errors", "crc"),
    ("crc_data_errors", "crc_data"),
    ("replay_errors", "replay"),
    ("recovery_errors", "recovery"),
    ("symbol_errors", "symbol"),
    ("effective_errors", "effective"),
    ("recovery_failed", "recovery_failed"),
)
#: the counters whose rise means lost bandwidth or a failing link (symbol errors are corrected by FEC and
#: climb on every healthy Blackwell link, so they are exported but not counted here)
ERROR_COUNTERS: tuple[str, ...] = (
    "crc_errors",
    "crc_data_errors",
    "replay_errors",
    "recovery_errors",
    "effective_errors",
    "recovery_failed",
)

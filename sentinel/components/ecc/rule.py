"""ECC counters and retired pages: the rules.

NVML keeps ECC counts twice: *volatile* (since the last driver load / GPU reset) and *aggregate* (life of
the board, stored in the InfoROM), each split into corrected (single-bit, SEC) and uncorrected (double-bit,
DED) errors; Ampere and later also tell SRAM from DRAM. Before Ampere, bad memory was handled by
*retiring pages*: a page retires after a double-bit error or repeated single-bit errors, takes effect at
the next driver reload ("pending"), and NVIDIA treats a board as worn out once about 60 pages are retired
(the InfoROM holds at most 64).

Rules: an uncorrected error since the last reset, or a rise of the aggregate uncorrected count, makes the
GPU faulty (reset to let repair take effect); SRAM uncorrected errors beyond NVIDIA's threshold (or the
driver's own "threshold exceeded" flag) mean RMA; pending retired pages ask for a reset; the retired-page
total at NVIDIA's limit means RMA.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from sentinel.components.ecc.record import EccCounters, RetiredPages
from sentinel.components.vocab import Finding

# The rules' outcomes, declared once: the log classifier (sentinel.signals) and the alerts (ecc/alerts.py)
# take severity and action from these rather than deciding again.
SRAM_THRESHOLD: Final = Finding(
    state="faulty", severity="critical", action="rma", reason="ecc_sram_threshold"
)
UNCORRECTED_VOLATILE: Final = Finding(
    state="faulty", severity="critical", action="reset_gpu", reason="ecc_uncorrected_volatile"
)
UNCORRECTED_RISING: Final = Finding(
    state="faulty", severity="critical", action="reset_gpu", reason="ecc_uncorrected_rising"
)
CORRECTED_BURST: Final = Finding(
    state="suspect", severity="warning", action="none", reason="ecc_corrected_burst"
)
OK: Final = Finding(state="ok", severity="info", action="none", reason="ecc_ok")
RETIRED_LIMIT: Final = Finding(
    state="faulty", severity="critical", action="rma", reason="retired_pages_limit"
)
RETIRED_PENDING: Final = Finding(
    state="suspect", severity="warning", action="reset_gpu", reason="retired_pages_pending"
)
RETIRED_OK: Final = Finding(state="ok", severity="info", action="none", reason="retired_pages_ok")
#: ``nvidia-smi -q``'s ECC mode: a pending mode differing from the current one takes a reboot
MODE_CHANGE_PENDING: Final = Finding(
    state="suspect", severity="warning", action="reboot", reason="ecc_mode_change_pending"
)
MODE: Final = Finding(state="ok", severity="info", action="none", reason="ecc_mode")
# What a log line that only *says* so means (no counters to read): the same decisions under the reason a
# line gives.
REPORTED_UNCORRECTABLE: Final = msgspec.structs.replace(UNCORRECTED_VOLATILE, reason="ecc_uncorrectable")
REPORTED_RETIRED: Final = msgspec.structs.replace(RETIRED_PENDING, reason="retired_pages")
REPORTED_CORRECTABLE: Final = msgspec.structs.replace(OK, reason="ecc_correctable")


class EccThresholds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Limits for the ECC and retired-page rules (embeddable as a TOML section)."""

    retired_pages_rma: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=64,
            description="Retired pages (single + double bit) at which the board is worn out "
            "and goes to RMA; NVIDIA's guidance is about 60 of the 64 pages the InfoROM can hold.",
        ),
    ] = 60
    sram_uncorrected_rma: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="Aggregate SRAM uncorrected errors above which the GPU goes to RMA; SRAM "
            "cannot be remapped, NVIDIA treats more than a handful (4) as a failing part.",
        ),
    ] = 4
    corrected_rise_warn: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="Rise of volatile corrected errors between two samples that counts as "
            "degrading memory (Xid 92 territory): a steady trickle is normal, a burst is not.",
        ),
    ] = 1000


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def evaluate_ecc(
    current: EccCounters, previous: EccCounters | None = None, thresholds: EccThresholds | None = None
) -> Finding:
    """Apply the ECC rules to one sample (and the previous one, to see a rise)."""
    limits = thresholds or EccThresholds()
    vol_unc = current.volatile_uncorrected or 0
    agg_unc = current.aggregate_uncorrected or 0
    evidence = [
        f"volatile: corrected={current.volatile_corrected}, uncorrected={current.volatile_uncorrected}",
        f"aggregate: corrected={current.aggregate_corrected}, uncorrected={current.aggregate_uncorrected}",
    ]
    sram_agg = current.sram_uncorrected
    if current.sram_threshold_exceeded or (sram_agg or 0) > limits.sram_uncorrected_rma:
        return SRAM_THRESHOLD.because(
            *evidence, f"aggregate SRAM uncorrected={sram_agg} (limit {limits.sram_uncorrected_rma})"
        )
    if vol_unc > 0:
        where = _location(current.volatile_sram_uncorrected, current.volatile_dram_uncorrected)
        return UNCORRECTED_VOLATILE.because(*evidence, f"uncorrected ECC error(s) since last reset{where}")
    if previous is not None and agg_unc > (previous.aggregate_uncorrected or 0):
        return UNCORRECTED_RISING.because(
            *evidence, f"aggregate uncorrected rose from {previous.aggregate_uncorrected}"
        )
    if previous is not None:
        rise = (current.volatile_corrected or 0) - (previous.volatile_corrected or 0)
        if rise >= limits.corrected_rise_warn:
            return CORRECTED_BURST.because(*evidence, f"{rise} corrected errors since the previous sample")
    return OK.because(*evidence)


def _location(sram: int | None, dram: int | None) -> str:
    parts = []
    if (sram or 0) > 0:
        parts.append(f"SRAM={sram}")
    if (dram or 0) > 0:
        parts.append(f"DRAM={dram}")
    return f" ({', '.join(parts)})" if parts else ""


def evaluate_retired_pages(pages: RetiredPages, thresholds: EccThresholds | None = None) -> Finding:
    """Apply the page-retirement rules (pre-Ampere GPUs; all ``None`` on Ampere+ means nothing to do)."""
    limits = thresholds or EccThresholds()
    total = _sum(pages.single_bit, pages.double_bit)
    evidence = (
        f"retired pages: single_bit={pages.single_bit}, double_bit={pages.double_bit}, "
        f"pending={pages.pending}",
    )
    if total is not None and total >= limits.retired_pages_rma:
        return RETIRED_LIMIT.because(*evidence, f"{total} retired pages >= limit {limits.retired_pages_rma}")
    if pages.pending:
        return RETIRED_PENDING.because(*evidence, "a page retirement waits for a GPU reset / driver reload")
    return RETIRED_OK.because(*evidence)

"""ECC counters and retired pages: models and rules.

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

from typing import Annotated

import msgspec

from sentinel.signals._nvsmi import count_value, read_sections, yes_no
from sentinel.signals.health import MemoryFinding


class EccCounter(msgspec.Struct, frozen=True, kw_only=True):
    """Corrected and uncorrected error counts of one scope (volatile or aggregate) and location."""

    corrected: int | None = None
    uncorrected: int | None = None


class EccCounts(msgspec.Struct, frozen=True, kw_only=True):
    """One sample of a GPU's ECC counters (``None`` where NVML does not report them)."""

    volatile: EccCounter = EccCounter()
    aggregate: EccCounter = EccCounter()
    volatile_sram: EccCounter | None = None
    volatile_dram: EccCounter | None = None
    aggregate_sram: EccCounter | None = None
    aggregate_dram: EccCounter | None = None
    #: nvidia-smi "SRAM Threshold Exceeded" (Hopper+): the driver's own RMA hint.
    sram_threshold_exceeded: bool | None = None


class RetiredPages(msgspec.Struct, frozen=True, kw_only=True):
    """Pre-Ampere dynamic page retirement (``nvmlDeviceGetRetiredPages`` / pending status)."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


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
    current: EccCounts, previous: EccCounts | None = None, thresholds: EccThresholds | None = None
) -> MemoryFinding:
    """Apply the ECC rules to one sample (and the previous one, to see a rise)."""
    limits = thresholds or EccThresholds()
    vol_unc = current.volatile.uncorrected or 0
    agg_unc = current.aggregate.uncorrected or 0
    evidence = [
        f"volatile: corrected={current.volatile.corrected}, uncorrected={current.volatile.uncorrected}",
        f"aggregate: corrected={current.aggregate.corrected}, uncorrected={current.aggregate.uncorrected}",
    ]
    sram_agg = current.aggregate_sram.uncorrected if current.aggregate_sram else None
    if current.sram_threshold_exceeded or (sram_agg or 0) > limits.sram_uncorrected_rma:
        return MemoryFinding(
            state="faulty",
            severity="critical",
            action="rma",
            reason="ecc_sram_threshold",
            evidence=(
                *evidence,
                f"aggregate SRAM uncorrected={sram_agg} (limit {limits.sram_uncorrected_rma})",
            ),
        )
    if vol_unc > 0:
        where = _location(current.volatile_sram, current.volatile_dram)
        return MemoryFinding(
            state="faulty",
            severity="critical",
            action="reset_gpu",
            reason="ecc_uncorrected_volatile",
            evidence=(*evidence, f"uncorrected ECC error(s) since last reset{where}"),
        )
    if previous is not None and agg_unc > (previous.aggregate.uncorrected or 0):
        return MemoryFinding(
            state="faulty",
            severity="critical",
            action="reset_gpu",
            reason="ecc_uncorrected_rising",
            evidence=(*evidence, f"aggregate uncorrected rose from {previous.aggregate.uncorrected}"),
        )
    if previous is not None:
        rise = (current.volatile.corrected or 0) - (previous.volatile.corrected or 0)
        if rise >= limits.corrected_rise_warn:
            return MemoryFinding(
                state="suspect",
                severity="warning",
                action="none",
                reason="ecc_corrected_burst",
                evidence=(*evidence, f"{rise} corrected errors since the previous sample"),
            )
    return MemoryFinding(
        state="ok", severity="info", action="none", reason="ecc_ok", evidence=tuple(evidence)
    )


def _location(sram: EccCounter | None, dram: EccCounter | None) -> str:
    parts = []
    if sram is not None and (sram.uncorrected or 0) > 0:
        parts.append(f"SRAM={sram.uncorrected}")
    if dram is not None and (dram.uncorrected or 0) > 0:
        parts.append(f"DRAM={dram.uncorrected}")
    return f" ({', '.join(parts)})" if parts else ""


def evaluate_retired_pages(pages: RetiredPages, thresholds: EccThresholds | None = None) -> MemoryFinding:
    """Apply the page-retirement rules (pre-Ampere GPUs; all ``None`` on Ampere+ means nothing to do)."""
    limits = thresholds or EccThresholds()
    total = _sum(pages.single_bit, pages.double_bit)
    evidence = (
        f"retired pages: single_bit={pages.single_bit}, double_bit={pages.double_bit}, "
        f"pending={pages.pending}",
    )
    if total is not None and total >= limits.retired_pages_rma:
        return MemoryFinding(
            state="faulty",
            severity="critical",
            action="rma",
            reason="retired_pages_limit",
            evidence=(*evidence, f"{total} retired pages >= limit {limits.retired_pages_rma}"),
        )
    if pages.pending:
        return MemoryFinding(
            state="suspect",
            severity="warning",
            action="reset_gpu",
            reason="retired_pages_pending",
            evidence=(*evidence, "a page retirement waits for a GPU reset / driver reload"),
        )
    return MemoryFinding(
        state="ok", severity="info", action="none", reason="retired_pages_ok", evidence=evidence
    )


def parse_ecc(text: str) -> EccCounts | None:
    """Read the ``ECC Errors`` section of an ``nvidia-smi -q`` excerpt; ``None`` if there is none.

    Understands the Ampere+ layout (``SRAM Correctable``, ``DRAM Uncorrectable``, ...) and the older one
    (``Single Bit`` / ``Double Bit`` with a ``Total`` line).
    """
    scopes: dict[str, dict[str, dict[str, int]]] = {"volatile": {}, "aggregate": {}}
    threshold: bool | None = None
    found = False
    for path, value in read_sections(text):
        if "ecc errors" not in path:
            continue
        found = True
        key = path[-1]
        if "threshold exceeded" in key:
            threshold = yes_no(value)
            continue
        scope = "volatile" if "volatile" in path else "aggregate" if "aggregate" in path else None
        if scope is None:
            continue
        count = count_value(value)
        if count is None:
            continue
        joined = " ".join(path)
        corrected = "single bit" in joined or (" correctable" in f" {key}" and "uncorrectable" not in key)
        location = "sram" if "sram" in key else "dram" if "dram" in key else "total"
        if "single bit" in joined or "double bit" in joined:
            if key != "total":
                continue
            location = "total"
        field = "corrected" if corrected else "uncorrected"
        bucket = scopes[scope].setdefault(location, {})
        bucket[field] = bucket.get(field, 0) + count
    if not found:
        return None

    def counter(scope: str, location: str) -> EccCounter | None:
        data = scopes[scope].get(location)
        return EccCounter(**data) if data is not None else None

    def total(scope: str) -> EccCounter:
        explicit = counter(scope, "total")
        if explicit is not None:
            return explicit
        sram, dram = counter(scope, "sram"), counter(scope, "dram")
        return EccCounter(
            corrected=_sum(sram.corrected if sram else None, dram.corrected if dram else None),
            uncorrected=_sum(sram.uncorrected if sram else None, dram.uncorrected if dram else None),
        )

    return EccCounts(
        volatile=total("volatile"),
        aggregate=total("aggregate"),
        volatile_sram=counter("volatile", "sram"),
        volatile_dram=counter("volatile", "dram"),
        aggregate_sram=counter("aggregate", "sram"),
        aggregate_dram=counter("aggregate", "dram"),
        sram_threshold_exceeded=threshold,
    )


def parse_retired_pages(text: str) -> RetiredPages | None:
    """Read the ``Retired Pages`` section of an ``nvidia-smi -q`` excerpt; ``None`` if there is none."""
    fields: dict[str, object] = {}
    found = False
    for path, value in read_sections(text):
        if "retired pages" not in path:
            continue
        found = True
        key = path[-1]
        if key.startswith("single bit"):
            fields["single_bit"] = count_value(value)
        elif key.startswith("double bit"):
            fields["double_bit"] = count_value(value)
        elif key.startswith("pending"):
            fields["pending"] = yes_no(value)
    if not found:
        return None
    return RetiredPages(**fields)  # type: ignore[arg-type]

"""Row remapping (Ampere and later): model of NVML's remapped-row counters and the rules on them.

NVML reports, per GPU, how many DRAM rows were remapped because of correctable errors and because of
uncorrectable errors, whether a remap is *pending* (recorded, takes effect at the next GPU reset) and
whether a remap *failed* (no spare row left in that bank). The bank-availability histogram says how many
memory banks still have many (max/high), some (partial), few (low) or no (none) spare rows.

Rules (NVIDIA's memory error management guidance):

* remapping failure -> the memory cannot repair itself any more: faulty, RMA;
* pending with uncorrectable remaps -> an uncorrectable error already hit: faulty until reset, reset_gpu;
* pending (correctable only) -> schedule a reset: suspect, reset_gpu;
* uncorrectable remaps rising since the previous sample, or banks with low/no spare rows -> early warning.

Correctable and uncorrectable counts are kept in separately named fields end to end; ``from_nvml`` takes
NVML's tuple in its documented order so nobody has to remember it.
"""

from __future__ import annotations

import msgspec

from sentinel.signals._nvsmi import count_value, read_sections, yes_no
from sentinel.signals.health import MemoryFinding


class RemappedRows(msgspec.Struct, frozen=True, kw_only=True):
    """NVML ``nvmlDeviceGetRemappedRows``: rows remapped so far and the remapper's state."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None

    @classmethod
    def from_nvml(cls, values: tuple[int, int, int | bool, int | bool]) -> RemappedRows:
        """From ``pynvml.nvmlDeviceGetRemappedRows(handle)`` = (corrRows, uncRows, isPending, failureOccurred)."""
        corr, unc, pending, failure = values
        return cls(
            correctable=int(corr), uncorrectable=int(unc), pending=bool(pending), failure=bool(failure)
        )


class BankAvailability(msgspec.Struct, frozen=True, kw_only=True):
    """NVML ``nvmlDeviceGetRowRemapperHistogram``: number of banks per level of spare rows left."""

    max: int | None = None
    high: int | None = None
    partial: int | None = None
    low: int | None = None
    none: int | None = None


class RowRemapStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One sample of a GPU's row-remapping state."""

    rows: RemappedRows
    histogram: BankAvailability | None = None


def evaluate_row_remap(current: RowRemapStatus, previous: RowRemapStatus | None = None) -> MemoryFinding:
    """Apply the row-remapping rules to one sample (and the previous one, to see a rise)."""
    rows = current.rows
    corr = rows.correctable or 0
    unc = rows.uncorrectable or 0
    evidence = [
        f"remapped rows: correctable={rows.correctable}, uncorrectable={rows.uncorrectable}",
        f"pending={rows.pending}, failure={rows.failure}",
    ]
    if rows.failure:
        return MemoryFinding(
            state="faulty",
            severity="critical",
            action="rma",
            reason="row_remap_failure",
            evidence=(*evidence, "a row could not be remapped: no spare rows left"),
        )
    if rows.pending and unc > 0:
        return MemoryFinding(
            state="faulty",
            severity="critical",
            action="reset_gpu",
            reason="row_remap_pending_uncorrectable",
            evidence=(*evidence, "uncorrectable-error remap waits for a GPU reset"),
        )
    if rows.pending:
        return MemoryFinding(
            state="suspect",
            severity="warning",
            action="reset_gpu",
            reason="row_remap_pending",
            evidence=(*evidence, f"{corr} correctable-error remap(s) wait for a GPU reset"),
        )
    if previous is not None and unc > (previous.rows.uncorrectable or 0):
        return MemoryFinding(
            state="suspect",
            severity="warning",
            action="none",
            reason="row_remap_uncorrectable_rising",
            evidence=(*evidence, f"uncorrectable remaps rose from {previous.rows.uncorrectable} to {unc}"),
        )
    hist = current.histogram
    if hist is not None and ((hist.none or 0) > 0 or (hist.low or 0) > 0):
        return MemoryFinding(
            state="suspect",
            severity="warning",
            action="none",
            reason="row_remap_spares_low",
            evidence=(*evidence, f"banks with few spare rows: low={hist.low}, none={hist.none}"),
        )
    return MemoryFinding(
        state="ok", severity="info", action="none", reason="row_remap_ok", evidence=tuple(evidence)
    )


def parse_row_remap(text: str) -> RowRemapStatus | None:
    """Read the ``Remapped Rows`` section of an ``nvidia-smi -q`` excerpt; ``None`` if there is none."""
    rows: dict[str, object] = {}
    hist: dict[str, int | None] = {}
    found = False
    for path, value in read_sections(text):
        if "remapped rows" not in path:
            continue
        found = True
        key = path[-1]
        if "histogram" in " ".join(path[:-1]):
            if key in {"max", "high", "partial", "low", "none"}:
                hist[key] = count_value(value)
        elif key.startswith("correctable"):
            rows["correctable"] = count_value(value)
        elif key.startswith("uncorrectable"):
            rows["uncorrectable"] = count_value(value)
        elif key.startswith("pending"):
            rows["pending"] = yes_no(value)
        elif "failure" in key:
            rows["failure"] = yes_no(value)
    if not found:
        return None
    histogram = BankAvailability(**hist) if hist else None
    return RowRemapStatus(rows=RemappedRows(**rows), histogram=histogram)  # type: ignore[arg-type]

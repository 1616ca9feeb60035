"""Row remapping (Ampere and later): the rules on NVML's remapped-row counters.

Following NVIDIA's memory error management guidance: a remapping failure is faulty (RMA); a pending remap
after an uncorrectable error is faulty until reset; a pending correctable-only remap is suspect (reset);
rising uncorrectable remaps or banks with few spare rows are an early warning. Pure: records in, a
:class:`~sentinel.components.vocab.Finding` out; docs/signals.md lists the rules.
"""

from __future__ import annotations

from sentinel.components.rowremap.record import RowRemap
from sentinel.components.vocab import Finding


def evaluate_row_remap(current: RowRemap, previous: RowRemap | None = None) -> Finding:
    """Apply the row-remapping rules to one sample (and the previous one, to see a rise)."""
    corr = current.correctable or 0
    unc = current.uncorrectable or 0
    evidence = [
        f"remapped rows: correctable={current.correctable}, uncorrectable={current.uncorrectable}",
        f"pending={current.pending}, failure={current.failure}",
    ]
    if current.failure:
        return Finding(
            state="faulty",
            severity="critical",
            action="rma",
            reason="row_remap_failure",
            evidence=(*evidence, "a row could not be remapped: no spare rows left"),
        )
    if current.pending and unc > 0:
        return Finding(
            state="faulty",
            severity="critical",
            action="reset_gpu",
            reason="row_remap_pending_uncorrectable",
            evidence=(*evidence, "uncorrectable-error remap waits for a GPU reset"),
        )
    if current.pending:
        return Finding(
            state="suspect",
            severity="warning",
            action="reset_gpu",
            reason="row_remap_pending",
            evidence=(*evidence, f"{corr} correctable-error remap(s) wait for a GPU reset"),
        )
    if previous is not None and unc > (previous.uncorrectable or 0):
        return Finding(
            state="suspect",
            severity="warning",
            action="none",
            reason="row_remap_uncorrectable_rising",
            evidence=(*evidence, f"uncorrectable remaps rose from {previous.uncorrectable} to {unc}"),
        )
    if (current.hist_none or 0) > 0 or (current.hist_low or 0) > 0:
        return Finding(
            state="suspect",
            severity="warning",
            action="none",
            reason="row_remap_spares_low",
            evidence=(
                *evidence,
                f"banks with few spare rows: low={current.hist_low}, none={current.hist_none}",
            ),
        )
    return Finding(
        state="ok", severity="info", action="none", reason="row_remap_ok", evidence=tuple(evidence)
    )

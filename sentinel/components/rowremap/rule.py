"""Row remapping (Ampere and later): the rules on NVML's remapped-row counters.

Following NVIDIA's memory error management guidance: a remapping failure is faulty (RMA); a pending remap
after an uncorrectable error is faulty until reset; a pending correctable-only remap is suspect (reset);
rising uncorrectable remaps or banks with few spare rows are an early warning. Pure: records in, a
:class:`~sentinel.components.vocab.Finding` out; docs/signals.md lists the rules.
"""

from __future__ import annotations

from typing import Final

from sentinel.components.rowremap.record import RowRemap
from sentinel.components.vocab import Finding

# The rule's outcomes, declared once: the log classifier (sentinel.signals) and the alerts
# (rowremap/alerts.py) take severity and action from these rather than deciding again.
FAILURE: Final = Finding(state="faulty", severity="critical", action="rma", reason="row_remap_failure")
PENDING_UNCORRECTABLE: Final = Finding(
    state="faulty", severity="critical", action="reset_gpu", reason="row_remap_pending_uncorrectable"
)
PENDING: Final = Finding(state="suspect", severity="warning", action="reset_gpu", reason="row_remap_pending")
UNCORRECTABLE_RISING: Final = Finding(
    state="suspect", severity="warning", action="none", reason="row_remap_uncorrectable_rising"
)
SPARES_LOW: Final = Finding(state="suspect", severity="warning", action="none", reason="row_remap_spares_low")
OK: Final = Finding(state="ok", severity="info", action="none", reason="row_remap_ok")


def evaluate_row_remap(current: RowRemap, previous: RowRemap | None = None) -> Finding:
    """Apply the row-remapping rules to one sample (and the previous one, to see a rise)."""
    corr = current.correctable or 0
    unc = current.uncorrectable or 0
    evidence = [
        f"remapped rows: correctable={current.correctable}, uncorrectable={current.uncorrectable}",
        f"pending={current.pending}, failure={current.failure}",
    ]
    if current.failure:
        return FAILURE.because(*evidence, "a row could not be remapped: no spare rows left")
    if current.pending and unc > 0:
        return PENDING_UNCORRECTABLE.because(*evidence, "uncorrectable-error remap waits for a GPU reset")
    if current.pending:
        return PENDING.because(*evidence, f"{corr} correctable-error remap(s) wait for a GPU reset")
    if previous is not None and unc > (previous.uncorrectable or 0):
        return UNCORRECTABLE_RISING.because(
            *evidence, f"uncorrectable remaps rose from {previous.uncorrectable} to {unc}"
        )
    if (current.hist_none or 0) > 0 or (current.hist_low or 0) > 0:
        return SPARES_LOW.because(
            *evidence, f"banks with few spare rows: low={current.hist_low}, none={current.hist_none}"
        )
    return OK.because(*evidence)

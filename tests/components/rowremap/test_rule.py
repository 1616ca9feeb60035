"""Row-remap rules and the nvidia-smi parser, on the one RowRemap record."""

from __future__ import annotations

import pytest

from sentinel.components.rowremap.parse import parse_row_remap
from sentinel.components.rowremap.record import RowRemap
from sentinel.components.rowremap.rule import evaluate_row_remap


def rows(corr: int, unc: int, pending: bool, failure: bool, **hist: int) -> RowRemap:
    return RowRemap(
        correctable=corr,
        uncorrectable=unc,
        pending=pending,
        failure=failure,
        **{f"hist_{k}": v for k, v in hist.items()},
    )


@pytest.mark.parametrize(
    ("status", "state", "action", "severity"),
    [
        (rows(0, 0, False, False, max=640), "ok", "none", "info"),
        (rows(1, 0, True, False), "suspect", "reset_gpu", "warning"),
        (rows(0, 4, True, False), "faulty", "reset_gpu", "critical"),
        (rows(3, 8, False, True), "faulty", "rma", "critical"),
        (rows(0, 2, False, False, max=600, low=1, none=0), "suspect", "none", "warning"),
        (rows(0, 2, False, False, max=600, none=2), "suspect", "none", "warning"),
    ],
)
def test_row_remap_rules(status: RowRemap, state: str, action: str, severity: str) -> None:
    finding = evaluate_row_remap(status)
    assert (finding.state, finding.action, finding.severity) == (state, action, severity)


def test_row_remap_rising_uncorrectable_is_early_warning() -> None:
    finding = evaluate_row_remap(rows(0, 3, False, False), previous=rows(0, 2, False, False))
    assert (finding.state, finding.reason) == ("suspect", "row_remap_uncorrectable_rising")
    steady = evaluate_row_remap(rows(5, 2, False, False), previous=rows(1, 2, False, False))
    assert steady.state == "ok"


def test_row_remap_parse_never_swaps_columns() -> None:
    text = (
        "    Remapped Rows\n        Correctable Error                 : 3\n        Uncorrectable Error               : 1\n"
        "        Pending                           : No\n        Remapping Failure Occurred        : Yes\n"
        "        Bank Remap Availability Histogram\n            Max                           : 630 bank(s)\n"
        "            High                          : 8 bank(s)\n            Partial                       : 1 bank(s)\n"
        "            Low                           : 0 bank(s)\n            None                          : 1 bank(s)"
    )
    status = parse_row_remap(text)
    assert status is not None
    assert (status.correctable, status.uncorrectable, status.pending, status.failure) == (
        3,
        1,
        False,
        True,
    )
    hist = (status.hist_max, status.hist_high, status.hist_partial, status.hist_low, status.hist_none)
    assert hist == (630, 8, 1, 0, 1)
    assert parse_row_remap("nothing here") is None

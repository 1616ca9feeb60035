"""The end-of-demo summary text."""

from __future__ import annotations

from sentinel.demo.outcome import evaluate
from sentinel.demo.summary import render_summary
from tests.demo.helpers import fault, verdict

XID = fault(0, 10.0, "host-002", 6, "xid", xid=79)
HANG = fault(1, 20.0, "host-003", 2, "hang")
REMAP = fault(2, 200.0, "host-001", 1, "row_remap_pending")


def line_with(text: str, needle: str) -> str:
    return next(line for line in text.splitlines() if needle in line)


def test_summary_names_catches_misses_wrong_flags_and_uninjected_faults() -> None:
    verdicts = [
        verdict("1", "faulty", "host-002", 6, 11.5, reason="xid_79", action="reset_gpu"),
        verdict("2", "stuck", "host-002", 6, 16.0, reason="not_entered_collective", action="restart_app"),
        verdict("3", "stuck", "host-003", 5, 26.0, reason="not_entered_collective", action="restart_app"),
    ]
    faults = [XID, HANG, REMAP]
    text = render_summary(
        evaluate(faults, verdicts, 60.0), faults, scenario="t", ran_s=60.0, interrupted=True
    )
    assert "interrupted after 60s" in text
    xid = line_with(text, "xid 79")
    assert "host-002 gpu 6" in xid and "faulty xid_79 -> reset_gpu" in xid and "1.5s" in xid
    assert "MISSED" in line_with(text, "t+20s hang")
    assert "host-003 gpu 5" in line_with(text, "t+26.0s stuck")  # the blamed waiting peer
    assert "flagged wrongly (1)" in text
    assert "row_remap_pending on host-001 gpu 1" in line_with(text, "t+200s")
    assert "stuck not_entered_collective on host-002 gpu 6" in line_with(text, "after xid 79")
    assert line_with(text, "caught 1 of 2").endswith("missed: hang on host-003 gpu 2")


def test_clean_summary() -> None:
    text = render_summary(
        evaluate([XID], [verdict("1", "faulty", "host-002", 6, 12.0)], 30.0),
        [XID],
        scenario="t",
        ran_s=30.0,
        interrupted=False,
    )
    assert "finished after 30s" in text
    assert "flagged wrongly: none" in text
    assert "caught 1 of 1 injected faults" in text
    assert "MISSED" not in text


def test_application_xid_lines() -> None:
    app_xid = fault(0, 10.0, "host-001", 3, "xid", xid=13)
    quiet = render_summary(
        evaluate([app_xid], [], 60.0), [app_xid], scenario="t", ran_s=60.0, interrupted=False
    )
    assert "no verdict, as expected" in line_with(quiet, "xid 13")
    assert "caught 1 of 1" in quiet
    flagged = render_summary(
        evaluate([app_xid], [verdict("b", "faulty", "host-001", 3, 12.0, reason="xid_13")], 60.0),
        [app_xid],
        scenario="t",
        ran_s=60.0,
        interrupted=False,
    )
    assert "FLAGGED faulty xid_13, expected none" in line_with(flagged, "t+10s xid 13")
    assert line_with(flagged, "caught 0 of 1").endswith("flagged though harmless: xid 13 on host-001 gpu 3")


def test_interrupted_within_a_bound_is_pending_not_missed() -> None:
    text = render_summary(evaluate([HANG], [], 24.0), [HANG], scenario="t", ran_s=24.0, interrupted=True)
    assert "no verdict yet (within its 11s bound)" in line_with(text, "t+20s hang")
    assert "MISSED" not in text
    assert line_with(text, "caught 0 of 1").endswith("1 still within the detection bound when the demo ended")

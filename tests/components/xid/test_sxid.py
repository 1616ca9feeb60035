"""NVSwitch SXids: fatal or not by the line's word, the driver's severity line, then NVIDIA's list; the
line's severity and action, and the host's finding, from one table (sxid.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.xid.parse import parse_sxid
from sentinel.components.xid.sxid import (
    CONTINUED,
    DATA,
    NON_FATAL_SXIDS,
    SWITCH_ACTIONS,
    judge_sxid,
    markdown_table,
    switch_finding,
    sxid_fatal,
)
from sentinel.signals import classify_text
from tests.support import REPO

# Our own lines (switch addresses, links and data words chosen for these tests).
LINES = [
    ("nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 17 LTSSM Fault Up", True, "critical"),
    (
        "nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 12028, Non-fatal, Link 17 egress non-posted PRIV error",
        False,
        "warning",
    ),
    # the continuation lines of one event: the driver's severity number, else NVIDIA's non-fatal list
    (
        "nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 24007, Severity 1 Engine instance 17 Sub-engine instance 00",
        True,
        "critical",
    ),
    (
        "nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 19059, Severity 0 Engine instance 17 Sub-engine instance 00",
        False,
        "warning",
    ),
    ("nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 11012, Data {0x00000001, 0x00000000}", False, "warning"),
    ("nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 22013, Minion Link DLREQ interrupt", False, "warning"),
    # nobody says it is non-fatal: a switch error stays critical (a data line too, the corpus README's rule)
    ("nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 12028, Data {0x000002c0, 0x00aa0001}", None, "critical"),
    ("nvidia-nvswitch1: SXid (PCI:0000:8b:00.0): 26006, SOE HALTED", None, "critical"),
]


@pytest.mark.parametrize(("line", "fatal", "severity"), LINES)
def test_sxid_lines(line: str, fatal: bool | None, severity: str) -> None:
    record = parse_sxid(line)
    assert record is not None and record.fatal is fatal
    event = classify_text(f"[ 4711.000001] {line}")
    assert (event.kind, event.xid, event.severity, event.sxid) == ("other", None, severity, record.sxid)
    data = "Data {" in line
    assert event.action == ("reboot" if severity == "critical" and not data else "none")


def test_continuation_lines_carry_their_own_reason() -> None:
    first = judge_sxid(24007, "Fatal, Link 30 sourcetrack timeout error")
    severity = judge_sxid(24007, "Severity 1 Engine instance 30 Sub-engine instance 00")
    data = judge_sxid(24007, "Data {0x1000001e, 0x00000100}")
    assert (first.reason, first.continuation) == ("sxid_24007", False)
    assert (severity.reason, severity.severity) == (CONTINUED, "critical")
    assert (data.reason, data.severity, data.action, data.fatal) == (DATA, "critical", "none", None)


def test_a_fatal_sxid_makes_the_host_faulty_with_a_reboot() -> None:
    finding = switch_finding(24007, "0000:8a:00", "critical", 1, 20)
    assert finding is not None
    assert (finding.state, finding.action, finding.reason) == ("faulty", "reboot", "sxid_24007")
    assert "0000:8a:00" in finding.evidence[0] and "24007" in finding.evidence[0]


@given(count=st.integers(0, 300), threshold=st.integers(1, 256))
def test_non_fatal_sxids_are_at_most_degraded_and_only_when_repeated(count: int, threshold: int) -> None:
    finding = switch_finding(12028, "0000:8a:00", "warning", count, threshold)
    if count < threshold:
        assert finding is None
    else:
        assert finding is not None and (finding.state, finding.action) == ("suspect", "none")


@given(code=st.integers(0, 99999), rest=st.text(max_size=80))
def test_the_lines_own_word_wins(code: int, rest: str) -> None:
    assert sxid_fatal(code, "Non-fatal, " + rest) is False
    assert sxid_fatal(code, "Fatal, " + rest) is True
    if not any(word in rest.lower() for word in ("fatal", "severity")):
        assert sxid_fatal(code, rest) is (False if code in NON_FATAL_SXIDS else None)


@given(code=st.integers(0, 99999), rest=st.text(max_size=200))
def test_every_judgement_is_one_of_the_tables_rows(code: int, rest: str) -> None:
    judged = judge_sxid(code, rest)
    rows = {(r.severity, r.action) for r in SWITCH_ACTIONS.values()}
    assert (judged.severity, judged.action) in rows
    assert judged.reason in (CONTINUED, DATA, f"sxid_{code}")
    if judged.fatal is True:
        assert judged.severity == "critical"


def test_the_docs_table_is_the_code_table() -> None:
    assert markdown_table() in (REPO / "docs" / "signals.md").read_text(encoding="utf-8")

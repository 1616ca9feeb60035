"""NVSwitch SXids: fatal or not by the line's word, the driver's severity line, then NVIDIA's list."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.xid.parse import parse_sxid
from sentinel.components.xid.sxid import NON_FATAL_SXIDS, sxid_fatal
from sentinel.signals import classify_text

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
    # nobody says it is non-fatal: a switch error stays critical
    ("nvidia-nvswitch4: SXid (PCI:0000:8a:00.0): 12028, Data {0x000002c0, 0x00aa0001}", None, "critical"),
]


@pytest.mark.parametrize(("line", "fatal", "severity"), LINES)
def test_sxid_lines(line: str, fatal: bool | None, severity: str) -> None:
    record = parse_sxid(line)
    assert record is not None and record.fatal is fatal
    event = classify_text(f"[ 4711.000001] {line}")
    assert (event.kind, event.xid, event.severity) == ("other", None, severity)


@given(code=st.integers(0, 99999), rest=st.text(max_size=80))
def test_the_lines_own_word_wins(code: int, rest: str) -> None:
    assert sxid_fatal(code, "Non-fatal, " + rest) is False
    assert sxid_fatal(code, "Fatal, " + rest) is True
    if not any(word in rest.lower() for word in ("fatal", "severity")):
        assert sxid_fatal(code, rest) is (False if code in NON_FATAL_SXIDS else None)

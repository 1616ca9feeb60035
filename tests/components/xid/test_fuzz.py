"""The Xid and SXid kernel-line parsers on hostile text."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from sentinel.components.xid.parse import parse_sxid, parse_xid
from tests.components.fuzz import parses_within_bound, texts

FRAGMENTS = ["NVRM: Xid (PCI:", "0000:3b:00", "): ", "13, pid=", "name=", "SXid (", "NVRM: GPU at PCI:"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts(FRAGMENTS))
def test_the_xid_parsers_never_raise(text: str) -> None:
    parses_within_bound(parse_xid, text)
    parses_within_bound(parse_sxid, text)

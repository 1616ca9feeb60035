"""The row-remapping ``nvidia-smi -q`` parser on hostile text."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from sentinel.components.rowremap.parse import parse_row_remap
from tests.components.fuzz import parses_within_bound, texts

FRAGMENTS = [
    "    Remapped Rows\n",
    "        Correctable Error                 : ",
    "        Uncorrectable Error               : ",
    "        Pending                           : ",
    "        Remapping Failure Occurred        : ",
    "Yes",
    "No",
    "| Page Retirement/Row Remap | ",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts(FRAGMENTS))
def test_the_row_remap_parser_never_raises(text: str) -> None:
    parses_within_bound(parse_row_remap, text)

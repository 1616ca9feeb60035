"""The ECC and retired-pages ``nvidia-smi -q`` parsers on hostile text."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from sentinel.components.ecc.parse import parse_ecc, parse_retired_pages
from tests.components.fuzz import parses_within_bound, texts

FRAGMENTS = [
    "    ECC Errors\n        Volatile\n",
    "        Aggregate\n",
    "SRAM Uncorrectable",
    "DRAM Correctable",
    "    Retired Pages\n",
    "Single Bit ECC",
    "Double Bit ECC",
    "Pending Page Blacklist    : ",
    "Yes",
    "N/A",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts(FRAGMENTS))
def test_the_ecc_parsers_never_raise(text: str) -> None:
    parses_within_bound(parse_ecc, text)
    parses_within_bound(parse_retired_pages, text)

"""ECC and retired-page rules and the nvidia-smi parsers, on the one EccCounters / RetiredPages records."""

from __future__ import annotations

import pytest

from sentinel.components.ecc.parse import parse_ecc, parse_retired_pages
from sentinel.components.ecc.record import EccCounters, RetiredPages
from sentinel.components.ecc.rule import evaluate_ecc, evaluate_retired_pages


def test_ecc_uncorrected_volatile_is_faulty_and_sram_threshold_is_rma() -> None:
    one = EccCounters(
        volatile_corrected=0, volatile_uncorrected=1, aggregate_corrected=0, aggregate_uncorrected=1
    )
    assert (evaluate_ecc(one).state, evaluate_ecc(one).action) == ("faulty", "reset_gpu")
    worn = EccCounters(aggregate_uncorrected=9, sram_uncorrected=9)
    assert (evaluate_ecc(worn).state, evaluate_ecc(worn).action) == ("faulty", "rma")
    clean = EccCounters(
        volatile_corrected=12, volatile_uncorrected=0, aggregate_corrected=50, aggregate_uncorrected=0
    )
    assert evaluate_ecc(clean).state == "ok"
    rising = EccCounters(aggregate_uncorrected=2)
    assert evaluate_ecc(rising, previous=EccCounters(aggregate_uncorrected=1)).state == "faulty"
    burst = EccCounters(volatile_corrected=5000)
    assert evaluate_ecc(burst, previous=EccCounters(volatile_corrected=10)).state == "suspect"


def test_ecc_parse_sram_dram_layout() -> None:
    text = (
        "    ECC Errors\n        Volatile\n            SRAM Correctable              : 2\n"
        "            SRAM Uncorrectable            : 0\n            DRAM Correctable              : 7\n"
        "            DRAM Uncorrectable            : 1\n        Aggregate\n            SRAM Correctable              : 3\n"
        "            SRAM Uncorrectable            : 0\n            DRAM Correctable              : 9\n"
        "            DRAM Uncorrectable            : 1"
    )
    counts = parse_ecc(text)
    assert counts is not None
    assert (counts.volatile_corrected, counts.volatile_uncorrected) == (9, 1)
    assert (counts.volatile_dram_uncorrected, counts.volatile_sram_uncorrected) == (1, 0)
    assert (counts.sram_uncorrected, counts.dram_uncorrected) == (0, 1)
    assert evaluate_ecc(counts).reason == "ecc_uncorrected_volatile"


def test_ecc_parse_old_single_double_bit_layout() -> None:
    text = (
        "    ECC Errors\n        Volatile\n            Single Bit\n                Device Memory     : 4\n"
        "                Total             : 4\n            Double Bit\n                Device Memory     : 0\n"
        "                Total             : 0\n        Aggregate\n            Single Bit\n"
        "                Total             : 40\n            Double Bit\n                Total             : 2"
    )
    counts = parse_ecc(text)
    assert counts is not None
    assert (counts.volatile_corrected, counts.volatile_uncorrected) == (4, 0)
    assert (counts.aggregate_corrected, counts.aggregate_uncorrected) == (40, 2)
    assert evaluate_ecc(counts).state == "ok"


@pytest.mark.parametrize(
    ("pages", "state", "action"),
    [
        (RetiredPages(), "ok", "none"),
        (RetiredPages(single_bit=2, double_bit=0, pending=True), "suspect", "reset_gpu"),
        (RetiredPages(single_bit=40, double_bit=21, pending=False), "faulty", "rma"),
        (RetiredPages(single_bit=3, double_bit=1, pending=False), "ok", "none"),
    ],
)
def test_retired_pages_rules(pages: RetiredPages, state: str, action: str) -> None:
    finding = evaluate_retired_pages(pages)
    assert (finding.state, finding.action) == (state, action)


def test_retired_pages_na_is_not_a_count() -> None:
    pages = parse_retired_pages(
        "    Retired Pages\n        Single Bit ECC     : N/A\n        Double Bit ECC     : N/A\n        Pending Page Blacklist : N/A"
    )
    assert pages == RetiredPages(single_bit=None, double_bit=None, pending=None)

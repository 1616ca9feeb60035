"""The Xid catalog covers every code NVIDIA lists, with NVIDIA's buckets, and takes severity and action from
the bucket table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentinel.components.xid.buckets import nvidia_buckets, resolve
from sentinel.components.xid.catalog import XID_TABLE, xid_info
from sentinel.components.xid.nvidia import NVIDIA_XIDS
from sentinel.components.xid.parse import xid_severity

CORPUS = json.loads((Path(__file__).parents[2] / "data/corpus/logs/xid_catalog.json").read_text())
#: where our severity or action deliberately differs from the corpus's curated opinion: NVIDIA's bucket wins
DELIBERATE = {
    61: "CONTACT_SUPPORT: drain while a person investigates (the code is unused by current drivers)",
    122: "CONTACT_SUPPORT: drain while a person investigates",
    123: "CONTACT_SUPPORT: drain while a person investigates",
    154: "XID_154 alone is informational; the line's recovery value carries the action",
    156: "RESET_GPU: the GPU must be reset, so it is critical",
    157: "IGNORE: NVIDIA says no action (the curated critical was stricter than NVIDIA)",
}


def test_every_code_of_nvidias_catalog_has_an_entry() -> None:
    codes = {row["code"] for row in CORPUS["full_catalog"]}
    assert len(codes) == 172
    assert codes <= set(XID_TABLE)
    assert {row[0]: row[3] for row in NVIDIA_XIDS} == {
        r["code"]: r["immediate"] for r in CORPUS["full_catalog"]
    }
    assert {row[0]: row[4] for row in NVIDIA_XIDS} == {
        r["code"]: " ".join((r["investigatory"] or "").split()) for r in CORPUS["full_catalog"]
    }


def test_every_entry_takes_severity_and_action_from_the_bucket_table() -> None:
    for code, info in XID_TABLE.items():
        resolution = resolve(code)
        assert (info.severity, info.action) == (resolution.severity, resolution.action), code
        assert info.bucket == nvidia_buckets(code)[0].value


@pytest.mark.parametrize("row", CORPUS["curated"], ids=lambda r: str(r["code"]))
def test_curated_severity_and_action_agree(row: dict[str, object]) -> None:
    info = xid_info(int(str(row["code"])))
    expected = "warning" if row["daemon_severity"] == "info" else row["daemon_severity"]
    if info.code not in DELIBERATE:
        assert info.severity == expected
        assert info.action == row["recommended_action"]


def test_unknown_code_is_a_warning_that_names_it() -> None:
    info = xid_info(4242)
    assert (info.severity, info.action, info.faulty_at_once) == ("warning", "none", False)
    assert "4242" in info.name
    assert xid_severity(4242) == "warning"


def test_occurrence_severity_follows_the_line() -> None:
    nonfatal = "NVRM: Xid (PCI:0000:3b:00): 149, pid=1, name=python, Nonfatal NETIR_LINK_EVT, Link 02"
    assert xid_severity(149, nonfatal) == "warning"
    assert xid_severity(149) == "critical"
    none = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)"
    assert xid_severity(154, none) == "warning"

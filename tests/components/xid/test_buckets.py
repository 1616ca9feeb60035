"""NVIDIA's buckets decide every Xid's severity and action, through one table, with NVIDIA's context rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sentinel.components.vocab import ACTIONS
from sentinel.components.xid.buckets import (
    BUCKET_ACTIONS,
    CODE_ACTIONS,
    RECOVERY_ACTIONS,
    Bucket,
    markdown_table,
    nvidia_buckets,
    resolve,
)
from sentinel.components.xid.nvidia import NVIDIA_XIDS, NVLINK5_DECODE, XID154_RECOVERY
from sentinel.components.xid.parse import parse_xid
from sentinel.components.xid.rule import XidPolicy

CODE_LINK_FATAL_WHY = "NVIDIA: a link-fatal event leaves the GPU in the drain-and-reset state"
DOCS = Path(__file__).parents[3] / "docs/signals.md"


def test_nvidias_catalog_is_complete_and_typed() -> None:
    codes = [row[0] for row in NVIDIA_XIDS]
    assert codes == sorted(set(codes)) and len(codes) == 172
    assert all(row[3] in {b.value for b in Bucket} for row in NVIDIA_XIDS)
    assert {row[0] for row in NVLINK5_DECODE} == set(range(144, 151))
    assert all(len(row[2]) in (0, 32) and len(row[3]) in (0, 32) for row in NVLINK5_DECODE)
    assert set(XID154_RECOVERY) == set(RECOVERY_ACTIONS)


def test_every_bucket_nvidia_uses_has_an_action() -> None:
    used = {Bucket(row[3]) for row in NVIDIA_XIDS} | {Bucket(row[5]) for row in NVLINK5_DECODE}
    assert used <= set(BUCKET_ACTIONS)
    for rule in (*BUCKET_ACTIONS.values(), *CODE_ACTIONS.values(), *RECOVERY_ACTIONS.values()):
        assert rule.action in ACTIONS
        assert rule.follow_up is None or ACTIONS.index(rule.follow_up) > ACTIONS.index(rule.action)


@pytest.mark.parametrize(
    ("code", "bucket", "severity", "action"),
    [
        (8, "RESTART_APP", "warning", "restart_app"),
        (13, "RESTART_APP", "warning", "restart_app"),
        (43, "IGNORE", "warning", "none"),
        (48, "WORKFLOW_XID_48", "critical", "reset_gpu"),
        (54, "CHECK_MECHANICALS", "critical", "rma"),
        (64, "RESET_GPU", "critical", "reset_gpu"),
        (74, "WORKFLOW_NVLINK_ERR", "critical", "reset_gpu"),
        (78, "UPDATE_SWFW", "warning", "none"),
        (79, "RESTART_BM", "critical", "reboot"),
        (142, "CONTACT_SUPPORT", "warning", "drain"),
        (151, "RESTART_VM", "critical", "reboot"),
        (156, "RESET_GPU", "critical", "reset_gpu"),
        (157, "IGNORE", "warning", "none"),
        (159, "CHECK_UVM", "warning", "none"),
        (168, "", "critical", "reboot"),
        (173, "", "critical", "reboot"),
    ],
)
def test_code_alone(code: int, bucket: str, severity: str, action: str) -> None:
    resolution = resolve(code)
    assert (resolution.bucket.value, resolution.severity, resolution.action) == (bucket, severity, action)
    assert resolution.evidence().startswith(f"NVIDIA: {bucket or 'no bucket'}")


def test_follow_ups_and_departures_say_why() -> None:
    assert resolve(64).follow_up == "rma"
    assert resolve(74).follow_up == "rma"
    for rule in (BUCKET_ACTIONS[Bucket.RESTART_VM], BUCKET_ACTIONS[Bucket.CHECK_UVM], CODE_ACTIONS[169]):
        assert rule.why


def test_context_rules() -> None:
    assert "solo" in resolve(45).nvidia
    with_48 = resolve(45, other_codes=frozenset({48}))
    assert "follow the other Xid" in with_48.nvidia and "48" in with_48.nvidia
    assert with_48.action == "none"
    assert "drain and reset" in resolve(48, other_codes=frozenset({63})).nvidia
    assert (resolve(159, uvm=True).severity, resolve(159, uvm=True).action) == ("critical", "reset_gpu")
    drain = "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)"
    linked = resolve(154, drain, other_codes=frozenset({13, 149}))
    assert "recovery None -> Drain P2P (for Xid 149)" in linked.evidence()  # 13 is not one 154 summarises
    assert linked.action == "drain"
    assert nvidia_buckets(45) == (
        Bucket.WORKFLOW_XID_45,
        "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)",
    )


# Our own kernel lines (addresses, links and registers chosen for these tests).
LINES = [
    # NVLink5, registers in the layout from R575 on: RLW_REMAP with ErrorStatus bit 6 -> RESET_GPU/Fatal
    (
        "NVRM: Xid (PCI:0007:02:00): 145, pid=5150, name=trainer, RLW_REMAP Fatal XC0 i0 Link 05 "
        "(0x00000004 0x00000040 0x00000000 0x00000000)",
        145,
        "critical",
        "reset_gpu",
    ),
    # same unit, ErrorStatus bit 2 -> XID_154_EVAL/Non-fatal: the application's traffic, the 154 decides
    (
        "NVRM: Xid (PCI:0007:02:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 05 (0x00000004 0x00000004 0x0 0x0)",
        145,
        "warning",
        "restart_app",
    ),
    # the layout before R575: NETIR link down, reason 0b100001 -> RESET_GPU/Link Fatal
    (
        "NVRM: Xid (PCI:0003:01:00): 149, NETIR_LINK_EVT Fatal XC1 i0 Link 07 "
        "(0x0213f1c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "critical",
        "reset_gpu",
    ),
    # reason 0b100110: NVIDIA's bucket is IGNORE but the link is fatal -> drain and reset
    (
        "NVRM: Xid (PCI:0003:01:00): 149, NETIR_LINK_EVT Fatal XC1 i0 Link 07 "
        "(0x0263f1c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "critical",
        "reset_gpu",
    ),
    # registers no decode row knows: the printed word decides
    (
        "NVRM: Xid (PCI:0003:01:00): 147, TREX Nonfatal XC0 i0 Link 11 (0x7fff0000 0x00000400)",
        147,
        "warning",
        "none",
    ),
    (
        "NVRM: Xid (PCI:0003:01:00): 147, TREX Fatal XC0 i0 Link 11 (0x7fff0000 0x00000400)",
        147,
        "critical",
        "reset_gpu",
    ),
    # Xid 154, each recovery value NVIDIA lists
    (
        "NVRM: Xid (PCI:0005:00:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
        154,
        "critical",
        "drain",
    ),
    (
        "NVRM: Xid (PCI:0005:00:00): 154, GPU recovery action changed from 0x3 (Drain P2P) to 0x4 (Drain and Reset)",
        154,
        "critical",
        "reset_gpu",
    ),
    (
        "NVRM: Xid (PCI:0005:00:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        154,
        "critical",
        "reboot",
    ),
    (
        "NVRM: Xid (PCI:0005:00:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
        154,
        "warning",
        "none",
    ),
    # Xid 94 asking for a reset
    (
        "NVRM: Xid (PCI:0000:c1:00): 94, pid=77, name=serve, Contained: CE User Channel (0x9). RST: Yes.",
        94,
        "critical",
        "reset_gpu",
    ),
    (
        "NVRM: Xid (PCI:0000:c1:00): 94, pid=77, name=serve, Contained: SM (0x1). RST: No.",
        94,
        "warning",
        "restart_app",
    ),
]


@pytest.mark.parametrize(("line", "code", "severity", "action"), LINES)
def test_lines(line: str, code: int, severity: str, action: str) -> None:
    record = parse_xid(line)
    assert record is not None and record.xid == code
    assert (record.severity, record.action) == (severity, action)
    assert record.fatal == (severity == "critical")


def test_nvlink5_evidence_names_the_decode_row() -> None:
    resolution = resolve(145, "RLW_REMAP Fatal XC0 i0 Link 05 (0x00000004 0x00000040 0x0 0x0)")
    assert (
        "(investigate: CONTACT_SUPPORT); RLW_REMAP RESET_GPU/Fatal (decode >=R575)" in resolution.evidence()
    )
    link_fatal = resolve(149, "NETIR_LINK_EVT Fatal XC1 i0 Link 07 (0x0263f1c6 0x00000000 0x0)")
    assert "IGNORE/Link Fatal (decode <R575)" in link_fatal.evidence()
    assert (link_fatal.action, link_fatal.why) == ("reset_gpu", CODE_LINK_FATAL_WHY)


def test_xid74_evidence_names_link_and_class() -> None:
    record = parse_xid(
        "NVRM: Xid (PCI:0000:9a:00): 74, pid=9001, name=nccl-test, NVLink: fatal error detected on link 11"
        "(0x200000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
    )
    assert record is not None and (record.severity, record.action) == ("critical", "reset_gpu")
    assert "link 11: signal integrity" in resolve(74, record.message).evidence()


def test_the_policy_puts_nvidias_bucket_in_the_evidence_and_162_clears_163() -> None:
    policy = XidPolicy()
    line = "NVRM: Xid (PCI:0000:3b:00): 119, pid=1, name=python, Timeout after 6s of waiting for RPC response"
    record = parse_xid(line)
    assert record is not None
    decision = policy.observe(record, 100.0)
    assert decision.state == "faulty"
    assert any("NVIDIA: RESET_GPU (investigate: " in note for note in decision.evidence)

    cleared = XidPolicy()
    disengaged = parse_xid("NVRM: Xid (PCI:0000:5e:00): 163, Power Smoothing disengaged")
    reengaged = parse_xid("NVRM: Xid (PCI:0000:5e:00): 162, Power Smoothing re-engaged")
    assert disengaged is not None and reengaged is not None
    opened = cleared.observe(disengaged, 1.0)  # a warning of its own, nothing to act on
    assert (opened.state, opened.reason, opened.action, opened.changed) == (
        "suspect",
        "xid_163",
        "none",
        True,
    )
    cleared.observe(disengaged, 10.0)
    closed = cleared.observe(reengaged, 20.0)  # the pair resolves: the warning closes
    assert (closed.state, closed.reason) == ("ok", "ok")
    assert "Xid 162" in closed.evidence[-1] and "clears Xid 163" in closed.evidence[-1]
    assert cleared.observe(disengaged, 30.0).reason == "xid_163"  # disengaged again: a new warning
    alone = XidPolicy().observe(reengaged, 5.0)  # re-engaged with nothing open: nothing to say
    assert alone.state == "ok" and not alone.changed


def test_the_docs_table_is_generated_from_the_bucket_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"<!-- xid-buckets:start[^\n]*-->\n(.*?)<!-- xid-buckets:end -->", text, re.DOTALL)
    assert block is not None
    assert block.group(1) == markdown_table()

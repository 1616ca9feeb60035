"""Xid policy state machine and the row-remap / ECC / retired-page rules."""

from __future__ import annotations

import msgspec
import pytest

from sentinel.signals import (
    BankAvailability,
    EccCounter,
    EccCounts,
    RemappedRows,
    RetiredPages,
    RowRemapStatus,
    XidPolicy,
    XidPolicyConfig,
    evaluate_ecc,
    evaluate_retired_pages,
    evaluate_row_remap,
    parse_ecc,
    parse_retired_pages,
    parse_row_remap,
    parse_xid,
)
from sentinel.signals.xid import XidRecord

GPU = "0000:3b:00"


def xid(code: int, pid: int | None = None, tail: str = "details", gpu: str = GPU) -> XidRecord:
    middle = f"pid={pid}, name=python, " if pid is not None else ""
    record = parse_xid(f"NVRM: Xid (PCI:{gpu}): {code}, {middle}{tail}")
    assert record is not None
    return record


def test_xid13_three_processes_within_window_is_suspect_then_reset_clears() -> None:
    policy = XidPolicy()
    assert policy.observe(xid(13, pid=100), now=0).state == "ok"
    assert policy.observe(xid(13, pid=200), now=600).state == "ok"
    decision = policy.observe(xid(13, pid=300), now=1200)
    assert (decision.state, decision.reason, decision.changed) == ("suspect", "xid_13_repeated", True)
    assert decision.evidence
    assert policy.decision(GPU).state == "suspect"
    cleared = policy.observe_gpu_reset(GPU, now=5000)
    assert (cleared.state, cleared.reason, cleared.changed) == ("ok", "gpu_reset_observed", True)
    assert policy.observe(xid(13, pid=400), now=5001).state == "ok"


def test_xid13_alone_never_faulty_even_many_times() -> None:
    policy = XidPolicy()
    states = {policy.observe(xid(13, pid=pid), now=pid * 10.0).state for pid in range(1, 200)}
    assert "faulty" not in states
    assert policy.decision(GPU).state == "suspect"


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_codes_never_faulty(code: int) -> None:
    policy = XidPolicy(XidPolicyConfig(extra_faulty_codes=[code]))
    for pid in range(10):
        assert policy.observe(xid(code, pid=pid), now=float(pid)).state != "faulty"


def test_same_process_repeating_is_one_program_bug() -> None:
    policy = XidPolicy()
    for second in range(10):
        assert policy.observe(xid(31, pid=7), now=second * 60.0).state == "ok"


def test_repeats_outside_window_do_not_add_up() -> None:
    policy = XidPolicy(XidPolicyConfig(repeat_window_s=3600))
    assert policy.observe(xid(13, pid=1), now=0).state == "ok"
    assert policy.observe(xid(13, pid=2), now=4000).state == "ok"
    assert policy.observe(xid(13, pid=3), now=8000).state == "ok"


def test_one_event_printed_on_many_lines_counts_once() -> None:
    policy = XidPolicy()
    for _ in range(5):  # one Xid 13 per SM, same pid, same instant
        policy.observe(xid(13), now=10.0)
    assert policy.decision(GPU).state == "ok"


def test_79_is_faulty_at_once_and_time_does_not_clear() -> None:
    policy = XidPolicy()
    decision = policy.observe(xid(79, tail="GPU has fallen off the bus."), now=1)
    assert (decision.state, decision.reason, decision.action) == ("faulty", "xid_79", "reboot")
    assert policy.observe(xid(13, pid=5), now=10**9).state == "faulty"
    assert policy.decision(GPU).state == "faulty"
    assert [d.state for d in policy.observe_reboot(now=10**9 + 1)] == ["ok"]


def test_state_only_goes_up_and_action_escalates() -> None:
    policy = XidPolicy()
    policy.observe(xid(48), now=1)
    decision = policy.observe(xid(79), now=2)
    assert (decision.state, decision.reason, decision.action, decision.changed) == (
        "faulty",
        "xid_48",
        "reboot",
        False,
    )


def test_nonfatal_nvlink_and_secondary_xid45() -> None:
    policy = XidPolicy()
    assert policy.observe(xid(149, tail="NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x1)"), now=1).state == "ok"
    assert policy.observe(xid(149, tail="NETIR_LINK_EVT Fatal XC0 i0 Link 01 (0x1)"), now=2).state == "faulty"
    other = XidPolicy()
    for pid in range(5):
        other.observe(xid(45, pid=pid, tail="Ch 0000000c caused by previous Xid 149"), now=float(pid * 5))
    assert other.decision(GPU).state == "ok"


def test_per_gpu_isolation_and_config_round_trip() -> None:
    policy = XidPolicy()
    policy.observe(xid(79, gpu="0000:3b:00"), now=1)
    assert policy.decision("0000:86:00").state == "ok"
    config = msgspec.toml.decode(b"repeat_threshold = 2\nrepeat_window_s = 60.0\n", type=XidPolicyConfig)
    assert config.repeat_threshold == 2
    with pytest.raises(msgspec.ValidationError):
        msgspec.toml.decode(b"repeat_threshold = 1\n", type=XidPolicyConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.toml.decode(b"no_such_field = 1\n", type=XidPolicyConfig)
    schema = msgspec.json.schema(XidPolicyConfig)
    props = schema["$defs"]["XidPolicyConfig"]["properties"]
    assert all(prop.get("description") for prop in props.values())


def test_policy_memory_is_bounded() -> None:
    policy = XidPolicy(XidPolicyConfig(max_gpus=4, max_events_per_gpu=8))
    for index in range(100):
        policy.observe(xid(13, pid=index, gpu=f"0000:{index % 256:02x}:00"), now=float(index))
    assert len(policy.decisions()) <= 4


# --- row remapping ------------------------------------------------------------------------------------


def rows(corr: int, unc: int, pending: bool, failure: bool, **hist: int) -> RowRemapStatus:
    histogram = BankAvailability(**hist) if hist else None
    return RowRemapStatus(
        rows=RemappedRows(correctable=corr, uncorrectable=unc, pending=pending, failure=failure),
        histogram=histogram,
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
def test_row_remap_rules(status: RowRemapStatus, state: str, action: str, severity: str) -> None:
    finding = evaluate_row_remap(status)
    assert (finding.state, finding.action, finding.severity) == (state, action, severity)


def test_row_remap_rising_uncorrectable_is_early_warning() -> None:
    finding = evaluate_row_remap(rows(0, 3, False, False), previous=rows(0, 2, False, False))
    assert (finding.state, finding.reason) == ("suspect", "row_remap_uncorrectable_rising")
    steady = evaluate_row_remap(rows(5, 2, False, False), previous=rows(1, 2, False, False))
    assert steady.state == "ok"


def test_row_remap_from_nvml_keeps_order() -> None:
    remapped = RemappedRows.from_nvml((7, 2, 0, 0))
    assert (remapped.correctable, remapped.uncorrectable, remapped.pending, remapped.failure) == (
        7,
        2,
        False,
        False,
    )


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
    assert (status.rows.correctable, status.rows.uncorrectable, status.rows.pending, status.rows.failure) == (
        3,
        1,
        False,
        True,
    )
    assert status.histogram == BankAvailability(max=630, high=8, partial=1, low=0, none=1)
    assert parse_row_remap("nothing here") is None


# --- ECC and retired pages ----------------------------------------------------------------------------


def test_ecc_uncorrected_volatile_is_faulty_and_sram_threshold_is_rma() -> None:
    one = EccCounts(
        volatile=EccCounter(corrected=0, uncorrected=1), aggregate=EccCounter(corrected=0, uncorrected=1)
    )
    assert (evaluate_ecc(one).state, evaluate_ecc(one).action) == ("faulty", "reset_gpu")
    worn = EccCounts(aggregate=EccCounter(uncorrected=9), aggregate_sram=EccCounter(uncorrected=9))
    assert (evaluate_ecc(worn).state, evaluate_ecc(worn).action) == ("faulty", "rma")
    clean = EccCounts(
        volatile=EccCounter(corrected=12, uncorrected=0), aggregate=EccCounter(corrected=50, uncorrected=0)
    )
    assert evaluate_ecc(clean).state == "ok"
    rising = EccCounts(aggregate=EccCounter(uncorrected=2))
    assert evaluate_ecc(rising, previous=EccCounts(aggregate=EccCounter(uncorrected=1))).state == "faulty"
    burst = EccCounts(volatile=EccCounter(corrected=5000))
    assert evaluate_ecc(burst, previous=EccCounts(volatile=EccCounter(corrected=10))).state == "suspect"


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
    assert counts.volatile == EccCounter(corrected=9, uncorrected=1)
    assert counts.volatile_dram == EccCounter(corrected=7, uncorrected=1)
    assert counts.aggregate_sram == EccCounter(corrected=3, uncorrected=0)
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
    assert counts.volatile == EccCounter(corrected=4, uncorrected=0)
    assert counts.aggregate == EccCounter(corrected=40, uncorrected=2)
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


@pytest.mark.parametrize(
    ("text", "kind", "severity"),
    [
        ("        Remapping Failure Occurred        : Yes", "row_remap", "critical"),
        ("        Remapping Failure Occurred        : No", "row_remap", "info"),
        ("        Pending Page Blacklist    : Yes", "ecc", "warning"),
        (
            "    ECC Mode\n        Current                           : Enabled\n        Pending                           : Disabled",
            "ecc",
            "warning",
        ),
        ("    ECC Mode\n        Current : Enabled\n        Pending : Enabled", "ecc", "info"),
    ],
)
def test_single_nvidia_smi_fields_and_ecc_mode(text: str, kind: str, severity: str) -> None:
    from sentinel.signals import classify_text

    event = classify_text(text)
    assert (event.kind, event.severity) == (kind, severity)

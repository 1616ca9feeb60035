"""Xid parser: prefixes, PCI forms, pid/name forms, SXid, fallen off the bus, secondary Xids."""

from __future__ import annotations

import pytest

from sentinel.components.vocab import ACTIONS
from sentinel.components.xid.catalog import APPLICATION_CODES, XID_TABLE, xid_info
from sentinel.components.xid.parse import parse_sxid, parse_xid
from sentinel.signals import classify_line, classify_text

BODY = "NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE)"


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[ 1234.567890] ",
        "[12345678.000001] ",
        "[Tue Mar  5 10:11:12 2024] ",
        "Mar  5 10:11:12 gpu-node-17 kernel: ",
        "Mar 05 10:11:12 gpu-node-17 kernel: [ 4711.000079] ",
        "2024-03-05T10:11:12.123456+00:00 gpu-node-17 kernel: ",
        "kernel: ",
        "<4>[  79.000013] ",
        "10.0.13.79 - ",
        "host-79-13: ",
        "[gpu-health] [CRITICAL] GPU-79: XID: ",
        'time="2024-03-05T10:11:12Z" level=warning msg="',
    ],
)
def test_prefixes_do_not_change_code_or_address(prefix: str) -> None:
    record = parse_xid(prefix + BODY)
    assert record is not None
    assert (record.xid, record.pci_bus, record.pid, record.process) == (48, "0000:3b:00", 4242, "python3")
    event = classify_line(prefix + BODY)
    assert event is not None
    assert (event.kind, event.xid, event.pci_bus, event.severity) == ("xid", 48, "0000:3b:00", "critical")


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("PCI:0000:3B:00", "0000:3b:00"),
        ("0000:3b:00", "0000:3b:00"),
        ("PCI:0000:10:1c", "0000:10:1c"),
        ("PCI:0018:01:00", "0018:01:00"),
        ("PCI:00000000:3b:00", "0000:3b:00"),
        ("PCI:0000:3b:00.0", "0000:3b:00"),
        ("PCI:...", None),
        ("PCI:xxxx:xx:xx", None),
        ("", None),
    ],
)
def test_pci_forms(address: str, expected: str | None) -> None:
    record = parse_xid(f"NVRM: Xid ({address}): 31, pid=1, name=a, MMU Fault")
    assert record is not None
    assert record.xid == 31
    assert record.pci_bus == expected


@pytest.mark.parametrize(
    ("middle", "pid", "process"),
    [
        ("pid=1234, name=python, ", 1234, "python"),
        ("pid='<unknown>', name=<unknown>, ", None, None),
        ("pid=<unknown>, name=<unknown>, ", None, None),
        ("pid=77, ", 77, None),
        ("", None, None),
        ("pid=9, name=nvc:[driver], ", 9, "nvc:[driver]"),
        ("pid=9, name=ray::WorkerDict, ", 9, "ray::WorkerDict"),
        ("pid=9, name=kworker/u256:3, ", 9, "kworker/u256:3"),
        ("pid=9, name=pt_main_thread, ", 9, "pt_main_thread"),
        ("pid=9, name=python3.10, ", 9, "python3.10"),
    ],
)
def test_pid_and_name_forms(middle: str, pid: int | None, process: str | None) -> None:
    record = parse_xid(f"[  42.1] NVRM: Xid (PCI:0000:01:00): 13, {middle}Graphics Exception: ESR 0x1=0x2")
    assert record is not None
    assert (record.xid, record.pid, record.process) == (13, pid, process)
    assert record.message.startswith("Graphics Exception")


def test_sxid_is_never_an_xid() -> None:
    line = "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    assert parse_xid(line) is None
    sxid = parse_sxid(line)
    assert sxid is not None
    assert (sxid.sxid, sxid.pci_bus, sxid.fatal) == (20034, "0000:06:00", True)
    event = classify_text(line)
    assert (event.kind, event.xid, event.pci_bus, event.severity) == ("other", None, "0000:06:00", "critical")
    nonfatal = classify_text(
        "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 PRIV error"
    )
    assert (nonfatal.kind, nonfatal.xid, nonfatal.severity) == ("other", None, "warning")


@pytest.mark.parametrize(
    ("line", "pci"),
    [
        ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "0000:01:00"),
        ("NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", "0000:91:00"),
        (
            "Sep 18 20:58:08 host kernel: [ 19.5] NVRM: GPU at PCI:0000:b3:00: GPU has fallen off the bus.",
            "0000:b3:00",
        ),
        (
            "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:20b5) installed in this system has fallen off the bus "
            "and is not responding to commands.",
            "0000:b3:00",
        ),
    ],
)
def test_fallen_off_the_bus_without_number_is_79(line: str, pci: str) -> None:
    record = parse_xid(line)
    assert record is not None
    assert (record.xid, record.pci_bus, record.severity, record.fatal) == (79, pci, "critical", True)


def test_caused_by_previous_xid_keeps_the_line_code() -> None:
    record = parse_xid(
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 149"
    )
    assert record is not None
    assert (record.xid, record.previous_xid) == (45, 149)


def test_mig_gpu_instance() -> None:
    record = parse_xid(
        "NVRM: Xid (PCI:0000:4b:00): 94, pid=12, name=python, Contained: SM (0x1) GPU-I:05. RST: No, D-RST: No"
    )
    assert record is not None
    assert (record.xid, record.gpu_instance, record.severity) == (94, 5, "warning")


def test_numbers_in_message_are_not_the_code() -> None:
    record = parse_xid("NVRM: Xid (PCI:0000:4c:00): 137, TLC RX interrupt hit on link 4 on GPU0: PRIV Error")
    assert record is not None
    assert record.xid == 137


@pytest.mark.parametrize(
    ("tail", "severity", "fatal"),
    [
        ("RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0)", "warning", False),
        ("NETIR_LINK_EVT Fatal XC0 i0 Link 01 (0x0)", "critical", True),
    ],
)
def test_nvlink5_severity_follows_the_line(tail: str, severity: str, fatal: bool) -> None:
    record = parse_xid(f"NVRM: Xid (PCI:0008:01:00): 149, {tail}")
    assert record is not None
    assert (record.severity, record.fatal) == (severity, fatal)


@pytest.mark.parametrize(
    ("target", "action", "severity"),
    [
        ("0x1 (GPU Reset Required)", "reset_gpu", "critical"),
        ("0x2 (Node Reboot Required)", "reboot", "critical"),
        ("0x4 (Drain and Reset)", "reset_gpu", "critical"),
        ("0x0 (None)", "none", "warning"),
    ],
)
def test_xid_154_action_is_read_from_the_line(target: str, action: str, severity: str) -> None:
    record = parse_xid(
        f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to {target}"
    )
    assert record is not None
    assert (record.action, record.severity) == (action, severity)


def test_catalog_application_codes_are_never_faulty_at_once() -> None:
    for code in APPLICATION_CODES:
        info = xid_info(code)
        assert info.cause == "application"
        assert not info.faulty_at_once
    assert xid_info(79).faulty_at_once
    assert xid_info(79).action == "reboot"
    assert xid_info(64).action == "reset_gpu"  # NVIDIA: RESET_GPU, rma only as the follow-up
    assert xid_info(99999).name == "unknown Xid 99999"
    assert all(info.action in ACTIONS for info in XID_TABLE.values())


def test_unknown_code_is_still_an_xid() -> None:
    event = classify_text("NVRM: Xid (PCI:0000:01:00): 999, something new")
    assert (event.kind, event.xid, event.severity) == ("xid", 999, "warning")


@pytest.mark.parametrize(
    "line",
    [
        "XID 48 is documented at docs.nvidia.com",
        "Xid: 79",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000}",
    ],
)
def test_not_gpu_xid_lines(line: str) -> None:
    assert parse_xid(line) is None

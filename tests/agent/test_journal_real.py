"""The agent's journald reader against the real ``journalctl``, reading real journal files.

The files are written by ``systemd-journal-remote`` from journald's export format (tests/support.py), two
boots of one host: the old boot's kernel records, then this boot's — more than the 10 that ``journalctl
-f`` prints by itself — with user-space records in between that ``-k`` must leave out. The reader is
pointed at them with ``--directory`` and told which boot is "this" one, as /proc would tell it.

What must hold (issue 14): with no saved cursor, or a cursor of another boot, the whole journal of this
boot is read; with a cursor of this boot, exactly the records after it (nothing lost, nothing repeated);
records written later are followed.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sentinel.agent.journal import JournalKernelReader
from sentinel.signals.kernel_source import cursor_boot
from tests.support import need_binary, write_journal

OLD_BOOT = "0123456789abcdef0123456789abcdef"
THIS_BOOT = "fedcba9876543210fedcba9876543210"
MACHINE = "4f3c2b1a09f8e7d6c5b4a39281706f5e"
HOST = "gpu-node-7"
T0_US = 1_764_590_000_000_000

OLD_LINES = [
    "Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org)",
    "NVRM: Xid (PCI:0000:17:00): 79, pid=2211, GPU has fallen off the bus.",
    "mlx5_core 0000:17:00.0: mlx5_pcie_event:301:(pid 0): Detected insufficient power on the PCIe slot",
]
THIS_LINES = [
    "Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org)",
    "Command line: BOOT_IMAGE=/boot/vmlinuz-6.1.0-27-amd64 root=/dev/nvme0n1p2 ro",
    "pci 0000:17:00.0: [15b3:101b] type 00 class 0x020700",
    "mlx5_core 0000:17:00.0: firmware version: 20.39.1002",
    "mlx5_core 0000:17:00.0: Rate limit: 127 rates are supported, range: 0Mbps to 97656Mbps",
    "mlx5_core 0000:17:00.0: E-Switch: Total vports 2, per vport: max uc(128) max mc(2048)",
    "mlx5_core 0000:17:00.0 ibp23s0: renamed from ib0",
    "nvidia: loading out-of-tree module taints kernel.",
    "nvidia-nvlink: Nvlink Core is being initialized, major device number 510",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from proprietary module nvidia.",
    "mlx5_core 0000:17:00.0: Port module event: module 0, Cable plugged",
    "mlx5_core 0000:17:00.0 ibp23s0: Link up",
    "NVRM: Xid (PCI:0000:3b:00): 48, pid=1818990, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
    "mlx5_core 0000:17:00.0 ibp23s0: Link down",
]


def _entry(boot: str, n: int, message: str, transport: str = "kernel") -> dict[str, str | int]:
    return {
        "__REALTIME_TIMESTAMP": T0_US + (0 if boot == OLD_BOOT else 3_600_000_000) + n * 1_000_000,
        "__MONOTONIC_TIMESTAMP": 5_000_000 + n * 1_000_000,
        "_BOOT_ID": boot,
        "_MACHINE_ID": MACHINE,
        "_HOSTNAME": HOST,
        "_TRANSPORT": transport,
        "PRIORITY": 6 if transport == "kernel" else 5,
        "SYSLOG_FACILITY": 0 if transport == "kernel" else 4,
        "SYSLOG_IDENTIFIER": "kernel" if transport == "kernel" else "sshd",
        "MESSAGE": message,
    }


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    need_binary("journalctl")
    folder = tmp_path / "journal"
    folder.mkdir()
    entries = []
    for boot, lines in ((OLD_BOOT, OLD_LINES), (THIS_BOOT, THIS_LINES)):
        for n, line in enumerate(lines):
            entries.append(_entry(boot, 2 * n, line))
            entries.append(_entry(boot, 2 * n + 1, f"Accepted publickey for user{n}", transport="syslog"))
    write_journal(folder / "system.journal", entries)
    return folder


def _journalctl_json(journal: Path, *args: str) -> list[dict[str, str]]:
    """What the real journalctl prints for these arguments (to take cursors from)."""
    out = subprocess.run(
        ["journalctl", f"--directory={journal}", "-o", "json", "--no-pager", "-q", *args],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def _reader(journal: Path, cursor: Path) -> JournalKernelReader:
    return JournalKernelReader(
        "journalctl", cursor_path=cursor, journal_args=[f"--directory={journal}"], boot_id=THIS_BOOT
    )


def _read_through_marker(reader: JournalKernelReader, journal: Path, marker: str) -> list[str]:
    """Everything the reader hands over up to a record written after it started: the marker comes last,
    so the list holds exactly what the reader read at its start, plus the followed marker."""
    messages: list[str] = []
    deadline = time.monotonic() + 30
    wrote = False
    while time.monotonic() < deadline:
        messages.extend(record.message for record in reader.poll(time.monotonic()))
        if not wrote and reader.is_open:
            write_journal(journal / "later.journal", [_entry(THIS_BOOT, 100, marker)])
            wrote = True
        if messages and messages[-1] == marker:
            return messages
        time.sleep(0.05)
    raise AssertionError(f"the marker never came; read so far: {messages}")


def test_first_start_reads_the_whole_boot_then_follows(journal: Path, tmp_path: Path) -> None:
    cursor = tmp_path / "journal.cursor"
    reader = _reader(journal, cursor)
    try:
        messages = _read_through_marker(reader, journal, "NVRM: Xid (PCI:0000:3b:00): 63, marker")
        reader.save_cursor()
    finally:
        reader.close()
    # All 15 kernel records of this boot (journalctl -f alone would give the last 10), none of the
    # old boot, no user-space record; then the followed one.
    assert messages == [*THIS_LINES, "NVRM: Xid (PCI:0000:3b:00): 63, marker"]
    last = _journalctl_json(journal, "-k", "-n", "1")[0]
    assert cursor.read_text() == last["__CURSOR"]
    assert cursor_boot(cursor.read_text()) == THIS_BOOT


def test_a_cursor_of_this_boot_resumes_right_after_it(journal: Path, tmp_path: Path) -> None:
    records = _journalctl_json(journal, "-k")
    assert [record["MESSAGE"] for record in records] == THIS_LINES
    cursor = tmp_path / "journal.cursor"
    cursor.write_text(records[6]["__CURSOR"])
    reader = _reader(journal, cursor)
    try:
        messages = _read_through_marker(reader, journal, "marker after resume")
    finally:
        reader.close()
    assert messages == [*THIS_LINES[7:], "marker after resume"]  # nothing lost, nothing repeated


@pytest.mark.parametrize("saved", ["old_boot", "garbage"])
def test_a_cursor_of_another_boot_or_no_cursor_at_all_reads_the_whole_boot(
    journal: Path, tmp_path: Path, saved: str
) -> None:
    old = _journalctl_json(journal, "-k", "-b", OLD_BOOT)
    assert [record["MESSAGE"] for record in old] == OLD_LINES
    cursor = tmp_path / "journal.cursor"
    cursor.write_text(old[-1]["__CURSOR"] if saved == "old_boot" else "s=not-a-cursor")
    reader = _reader(journal, cursor)
    try:
        messages = _read_through_marker(reader, journal, "marker after reboot")
    finally:
        reader.close()
    # journalctl --after-cursor=<old boot's cursor> would skip this boot's first record: not used.
    assert messages == [*THIS_LINES, "marker after reboot"]

"""The agent's journald kernel reader: follows journalctl, hands over records, resumes from its cursor, and
is chosen when /dev/kmsg cannot be opened. A stand-in ``journalctl`` (a shell script) is the child."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.agent.journal import JournalKernelReader, kernel_reader, start_arguments
from sentinel.agent.kmsg import KmsgReader, KmsgRecord
from sentinel.signals.kernel_source import cursor_boot

BOOT = "fedcba9876543210fedcba9876543210"
# Cursors in journalctl's own format (as --show-cursor and -o json's __CURSOR print them).
C1 = f"s=5b50e7d0fd774112be53099dc349e96d;i=5;b={BOOT};m=f4240;t=644e2a04d9a90;x=c2273a06db14d18c"
C2 = f"s=5b50e7d0fd774112be53099dc349e96d;i=7;b={BOOT};m=1e8480;t=644e2a05ce0b8;x=f18c20e78e7d9f69"


def _journalctl(folder: Path) -> str:
    """Prints two kernel records (the second echoes the arguments it got), then follows (sleeps)."""
    path = folder / "journalctl"
    first = json.dumps(
        {"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "__CURSOR": C1}
    )
    path.write_text(
        "#!/bin/sh\n"
        f"echo '{first}'\n"
        f'printf \'{{"MESSAGE": "args %s", "__CURSOR": "{C2}"}}\\n\' "$*"\n'
        "exec sleep 30\n",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _poll_until(reader: JournalKernelReader, count: int) -> list[KmsgRecord]:
    """The child writes asynchronously: poll (bounded) until it has written what it prints at once."""
    records: list[KmsgRecord] = []
    deadline = time.monotonic() + 20
    while len(records) < count and time.monotonic() < deadline:
        records.extend(reader.poll(time.monotonic()))
        time.sleep(0.05)
    return records


def test_follows_journald_and_resumes_after_its_cursor(tmp_path: Path) -> None:
    cursor = tmp_path / "journal.cursor"
    reader = JournalKernelReader(_journalctl(tmp_path), cursor_path=cursor, boot_id=BOOT)
    try:
        records = _poll_until(reader, 2)
        assert records[0].message.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
        assert "-b" in records[1].message.split()
        assert "--no-tail" in records[1].message  # no cursor yet: the whole of this boot
        assert reader.is_open
        reader.save_cursor()
    finally:
        reader.close()
    assert cursor.read_text() == C2
    again = JournalKernelReader(_journalctl(tmp_path), cursor_path=cursor, boot_id=BOOT)
    try:
        records = _poll_until(again, 2)
        assert f"--after-cursor={C2}" in records[1].message
    finally:
        again.close()
    assert not again.is_open


def test_without_a_state_directory_it_starts_at_the_end(tmp_path: Path) -> None:
    reader = JournalKernelReader(_journalctl(tmp_path), boot_id=BOOT)
    try:
        assert "--lines=0" in _poll_until(reader, 2)[1].message
    finally:
        reader.close()


def test_start_arguments() -> None:
    other = C2.replace(BOOT, "0" * 32)
    assert start_arguments(C2, BOOT, has_cursor_path=True) == ([f"--after-cursor={C2}"], "resume")
    dashed = "-".join((BOOT[:8], BOOT[8:12], BOOT[12:16], BOOT[16:20], BOOT[20:]))  # as /proc prints it
    assert start_arguments(C2, dashed, has_cursor_path=True)[1] == "resume"
    assert start_arguments(other, BOOT, has_cursor_path=True) == (["--no-tail"], "cursor_of_another_boot")
    assert start_arguments("c2", BOOT, has_cursor_path=True) == (["--no-tail"], "cursor_not_understood")
    assert start_arguments(None, BOOT, has_cursor_path=True) == (["--no-tail"], "no_cursor")
    assert start_arguments(None, BOOT, has_cursor_path=False) == (["--lines=0"], "no_state_dir")


def test_a_missing_journalctl_is_counted_not_raised(tmp_path: Path) -> None:
    reader = JournalKernelReader(str(tmp_path / "absent"))
    assert reader.poll(0.0) == []
    assert reader.open_errors == 1 and not reader.is_open


def test_journal_chosen_when_kmsg_is_not_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    assert isinstance(kernel_reader(str(kmsg), 10, journalctl=_journalctl(tmp_path)), KmsgReader)
    real_open = os.open

    def denied(path: str, flags: int, *args: int) -> int:
        if path == str(kmsg):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", denied)  # what a non-root agent gets under kernel.dmesg_restrict
    chosen = kernel_reader(str(kmsg), 10, journalctl=_journalctl(tmp_path))
    assert isinstance(chosen, JournalKernelReader)
    assert isinstance(kernel_reader(str(kmsg), 10, journalctl=str(tmp_path / "absent")), KmsgReader)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_cursor_boot_never_raises(text: str) -> None:
    boot = cursor_boot(text)
    assert boot is None or (len(boot) == 32 and f"b={boot};" in text)

"""Kernel log: record parsing (fuzzed), reading from the end, overruns, permission errors, Xid dedup."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent import kmsg
from sentinel.agent.kmsg import KmsgReader, parse_kmsg_record

XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def test_parse_kmsg_record_fields() -> None:
    record = parse_kmsg_record(f"4,1523,98765432,-;{XID_LINE}".encode())
    assert record is not None
    assert (record.priority, record.seq, record.ts_us) == (4, 1523, 98765432)
    assert record.message == XID_LINE
    assert parse_kmsg_record(b" SUBSYSTEM=pci") is None  # continuation line
    assert parse_kmsg_record(b"") is None
    plain = parse_kmsg_record(b"[ 12.5] plain dmesg line")
    assert plain is not None and plain.priority is None and plain.message == "[ 12.5] plain dmesg line"


@given(st.binary(max_size=600))
def test_kmsg_parser_never_raises(data: bytes) -> None:
    record = parse_kmsg_record(data)
    if record is not None:
        assert isinstance(record.message, str)
        assert record.priority is None or 0 <= record.priority <= 7


def _append(path: Path, *lines: str) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write(line + "\n")


def test_reader_starts_at_the_end_and_follows(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    _append(path, "6,1,100,-;old line before the agent started")
    reader = KmsgReader(str(path))
    assert reader.poll(0.0) == []
    _append(path, f"4,2,200,-;{XID_LINE}", " DEVICE=+pci:0000:3b:00.0", "6,3,300,-;something else")
    messages = [r.message for r in reader.poll(1.0)]
    assert messages == [XID_LINE, "something else"]
    path.write_text("")  # truncated (a plain file standing in for the device)
    _append(path, "6,4,400,-;after truncation")
    assert [r.message for r in reader.poll(2.0)] == ["after truncation"]
    reader.close()


def test_reader_survives_overrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    reader = KmsgReader(str(path))
    reader.poll(0.0)
    _append(path, "6,9,900,-;after the overrun")
    real_read = os.read
    failures = iter([True])

    def flaky_read(fd: int, n: int) -> bytes:
        if next(failures, False):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", flaky_read)
    assert [r.message for r in reader.poll(1.0)] == ["after the overrun"]
    assert reader.overruns == 1
    reader.close()


def test_reader_survives_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    real_open = os.open
    denied = {"on": True}

    def guarded_open(p: str, flags: int, *args: int) -> int:
        if denied["on"] and p == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", p)
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "open", guarded_open)
    reader = KmsgReader(str(path))
    assert reader.poll(0.0) == []
    assert reader.poll(1.0) == []  # no retry storm: it waits before opening again
    assert reader.open_errors == 1
    denied["on"] = False
    reader.poll(kmsg.REOPEN_AFTER_S + 1)  # reopened, from the end
    _append(path, "6,1,1,-;now readable")
    assert [r.message for r in reader.poll(kmsg.REOPEN_AFTER_S + 2)] == ["now readable"]
    reader.close()

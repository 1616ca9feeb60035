"""``sentinel logs classify --kernel``: journald first, then dmesg, then /dev/kmsg; each object keeps the
record's own time and host. Real subprocesses: small stand-in ``journalctl``/``dmesg`` programs on PATH
print what the real ones print."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.signals.kernel_source import (
    MAX_RECORD_BYTES,
    KernelSourceError,
    kernel_lines,
    parse_journal_line,
    parse_kmsg_line,
)
from sentinel.signals.stamp import line_stamp
from tests.support import need_binary, write_journal

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def _tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _classify(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "logs", "classify", "--kernel", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_journald_records_keep_their_time_and_host(tmp_path: Path) -> None:
    records = [
        {"MESSAGE": "Linux version 6.8.0", "__REALTIME_TIMESTAMP": "1732992000000000", "_HOSTNAME": "gpu-7"},
        {"MESSAGE": XID, "__REALTIME_TIMESTAMP": "1732992000123456", "_HOSTNAME": "gpu-7", "__CURSOR": "s=1"},
    ]
    body = "\n".join(json.dumps(r) for r in records)
    _tool(tmp_path, "journalctl", f"cat <<'EOF'\n{body}\nEOF\n")
    _tool(tmp_path, "dmesg", "echo should not be used; exit 1\n")
    result = _classify(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "from journal" in result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["kind"], e["xid"], e["host"], e["time"], e["line"]) for e in events] == [
        ("xid", 79, "gpu-7", "2024-11-30T18:40:00.123456Z", 2)
    ]


def test_dmesg_when_journald_has_nothing(tmp_path: Path) -> None:
    _tool(tmp_path, "journalctl", "exit 0\n")  # no journal files: prints nothing
    _tool(tmp_path, "dmesg", f"echo '2026-12-01T10:08:32,000000+00:00 {XID}'\n")
    result = _classify(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "from dmesg" in result.stderr
    (event,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (event["kind"], event["xid"], event["time"]) == ("xid", 79, "2026-12-01T10:08:32,000000+00:00")


def test_kmsg_when_neither_tool_works(tmp_path: Path) -> None:
    _tool(
        tmp_path,
        "journalctl",
        "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 1\n",
    )
    _tool(tmp_path, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"6,100,5000000,-;Linux version 6.8.0\n3,101,5107644336,-;{XID}\n SUBSYSTEM=pci\n")
    result = _classify(tmp_path, "--kmsg-path", str(kmsg))
    assert result.returncode == 0, result.stderr
    (event,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (event["kind"], event["xid"], event["line"]) == ("xid", 79, 2)
    assert event["time"] is not None and event["time"].endswith("Z")


def test_no_source_is_an_error_naming_each(tmp_path: Path) -> None:
    _tool(tmp_path, "journalctl", "echo 'permission denied' >&2; exit 1\n")
    _tool(tmp_path, "dmesg", "echo 'Operation not permitted' >&2; exit 1\n")
    result = _classify(tmp_path, "--kmsg-path", str(tmp_path / "missing"))
    assert result.returncode == 2
    for name in ("journal", "dmesg", "kmsg"):
        assert name in result.stderr
    with pytest.raises(KernelSourceError):
        kernel_lines("kmsg", kmsg=str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("line", "time", "host"),
    [
        ("Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: Xid", "Dec  2 10:43:35", "worker4"),
        (
            "2025-11-24T03:20:21.001125857Z gpu-server320 kernel: x",
            "2025-11-24T03:20:21.001125857Z",
            "gpu-server320",
        ),
        ("2026-12-01T10:08:32,000000+00:00 Command line: panic=1", "2026-12-01T10:08:32,000000+00:00", None),
        ("[Sun Feb 23 16:24:36 2025] NVRM: Xid", "Sun Feb 23 16:24:36 2025", None),
        ("[ 5107.644336] NVRM: Xid", "5107.644336", None),
        ("[2024-05-08 08:47:31,261] torch.distributed.elastic", "2024-05-08 08:47:31,261", None),
        ("Mar 29 15:38:59 node-7 systemd[1]: Started", "Mar 29 15:38:59", "node-7"),
        ("node1:1:2 [0] NCCL INFO Channel", None, None),
    ],
)
def test_line_stamp(line: str, time: str | None, host: str | None) -> None:
    assert line_stamp(line) == (time, host)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_record_parsers_never_raise(raw: bytes) -> None:
    """Any bytes: no record, or one with a non-empty bounded message; a stamp is read from the line itself."""
    for parsed in (parse_journal_line(raw), parse_kmsg_line(raw, 1.7e9)):
        assert parsed is None or 0 < len(parsed.message) <= MAX_RECORD_BYTES
    line = raw.decode("utf-8", "replace")
    when, host = line_stamp(line)
    assert when is None or when in line[:200]
    assert host is None or host in line[:200]


_MESSAGE = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\n\r"), max_size=120)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 7), st.integers(0, 2**40), st.integers(0, 10**9), _MESSAGE)
def test_kmsg_records_give_their_message_and_time(prio: int, seq: int, usec: int, message: str) -> None:
    """``PRIO,SEQ,USEC,FLAGS;MESSAGE``: the message as written (trailing space cut), at boot time + USEC."""
    parsed = parse_kmsg_line(f"{prio},{seq},{usec},-;{message}".encode(), 1.7e9)
    if not message.rstrip():
        assert parsed is None
        return
    assert parsed is not None and parsed.message == message.rstrip()
    assert parsed.time is not None
    stamp = datetime.fromisoformat(parsed.time.replace("Z", "+00:00")).timestamp()
    assert abs(stamp - (1.7e9 + usec / 1e6)) < 1e-3


OLD_BOOT, NEW_BOOT = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"


def _entry(boot: str, t_us: int, message: str, transport: str = "kernel") -> dict[str, str | int]:
    return {
        "__REALTIME_TIMESTAMP": t_us,
        "__MONOTONIC_TIMESTAMP": t_us - 1_732_990_000_000_000,
        "_BOOT_ID": boot,
        "_MACHINE_ID": "4f3c2b1a09f8e7d6c5b4a39281706f5e",
        "_HOSTNAME": "gpu-7",
        "_TRANSPORT": transport,
        "MESSAGE": message,
    }


def _journal(tmp_path: Path) -> Path:
    """Real journal files (systemd-journal-remote): an earlier boot's Xid, then this boot's records."""
    need_binary("journalctl")
    folder = tmp_path / "journal"
    folder.mkdir()
    write_journal(
        folder / "system.journal",
        [
            _entry(OLD_BOOT, 1_732_991_000_000_000, XID.replace("79", "48")),  # an earlier boot: not read
            _entry(NEW_BOOT, 1_732_992_000_000_000, "Linux version 6.8.0"),
            _entry(
                NEW_BOOT, 1_732_992_000_100_000, "Xid 79 mentioned by a user-space tool", transport="syslog"
            ),
            _entry(NEW_BOOT, 1_732_992_000_123_456, XID),
            _entry(NEW_BOOT, 1_732_992_001_000_000, "mlx5_core 0000:17:00.0 ib0: Link down"),
        ],
    )
    return folder


def _events(result: subprocess.CompletedProcess[str]) -> list[tuple[object, ...]]:
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    return [(e["kind"], e["severity"], e["xid"], e["host"], e["time"], e["line"]) for e in events]


THIS_BOOT_EVENTS = [
    ("xid", "critical", 79, "gpu-7", "2024-11-30T18:40:00.123456Z", 2),
    ("other", "warning", None, "gpu-7", "2024-11-30T18:40:01.000000Z", 3),
]


def test_journal_directory_read_by_the_real_journalctl(tmp_path: Path) -> None:
    """``--journal-directory``: the real journalctl reads real journal files: the newest boot's kernel
    records only, each with its own time and host."""
    folder = _journal(tmp_path)
    result = _classify(tmp_path, f"--journal-directory={folder}")
    assert "from journal" in result.stderr
    assert _events(result) == THIS_BOOT_EVENTS


def test_cursor_file_prints_only_what_is_new(tmp_path: Path) -> None:
    folder = _journal(tmp_path)
    cursor = tmp_path / "kernel.cursor"
    args = (f"--journal-directory={folder}", f"--cursor-file={cursor}")
    assert _events(_classify(tmp_path, *args)) == THIS_BOOT_EVENTS  # no cursor yet: the whole boot
    saved = cursor.read_text()
    last = subprocess.run(
        ["journalctl", f"--directory={folder}", "-k", "-n", "1", "--show-cursor", "-q", "-o", "cat"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert last.strip().endswith(f"-- cursor: {saved}")  # the cursor of the last record read
    assert _events(_classify(tmp_path, *args)) == []  # nothing new: nothing printed, not an error
    assert cursor.read_text() == saved
    write_journal(
        folder / "later.journal", [_entry(NEW_BOOT, 1_732_992_005_000_000, XID.replace("79", "94"))]
    )
    assert [(e[0], e[2]) for e in _events(_classify(tmp_path, *args))] == [("xid", 94)]
    # A cursor of an earlier boot: the whole boot again, not the boot minus its first record.
    old = subprocess.run(
        ["journalctl", f"--directory={folder}", "-k", "-b", OLD_BOOT, "-o", "json", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cursor.write_text(json.loads(old.splitlines()[-1])["__CURSOR"])
    result = _classify(tmp_path, *args)
    assert "of another boot" in result.stderr
    assert [e[2] for e in _events(result)] == [79, None, 94]

"""The kernel log: ``/dev/kmsg`` read from its end, surviving overruns and permission errors.

``/dev/kmsg`` returns one record per ``read()``: ``<prio>,<seq>,<usec>,<flags>[,...];<message>\\n`` followed
by optional continuation lines that start with a space (``SUBSYSTEM=...``). When the kernel ring wraps past
our read position ``read`` fails with EPIPE once and then continues with the oldest record still there: we
count the overrun and carry on. Without CAP_SYSLOG (``kernel.dmesg_restrict``) opening fails: the reader
counts it, logs it once, and retries now and then, while the rest of the agent keeps working.

The same reader follows a plain file (tests, or a ``dmesg`` copy): reads are then line-buffered, and a file
that shrinks is re-read from its start.

:func:`parse_kmsg_record` and :func:`parse_xid` are pure and fuzzed.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass

from sentinel.log import get_logger

MAX_RECORD_BYTES = 8192
REOPEN_AFTER_S = 60.0

log = get_logger(module="agent.kmsg")

_PREFIX = re.compile(rb"^(\d{1,3}),(\d{1,20}),(\d{1,20}),[^;]{0,64};")
_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})(?:\.\d)?\): (?P<xid>\d{1,5})\b"
)


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record; priority/seq/ts are None for plain (non-kmsg) lines."""

    message: str
    priority: int | None = None
    seq: int | None = None
    ts_us: int | None = None


@dataclass(frozen=True)
class XidLine:
    xid: int
    pci_bus: str  # dddd:bb:dd lower-case


def parse_kmsg_record(line: bytes) -> KmsgRecord | None:
    """One line of /dev/kmsg (without its newline) → a record; None for continuation or empty lines."""
    if not line or line[:1] == b" ":
        return None
    line = line[:MAX_RECORD_BYTES]
    match = _PREFIX.match(line)
    if match is None:
        text = line.decode("utf-8", "replace").strip()
        return KmsgRecord(message=text) if text else None
    prio = int(match.group(1)) & 7
    message = line[match.end() :].decode("utf-8", "replace").rstrip()
    return KmsgRecord(message=message, priority=prio, seq=int(match.group(2)), ts_us=int(match.group(3)))


def parse_xid(message: str) -> XidLine | None:
    """``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` → (79, "0000:3b:00")."""
    match = _XID.search(message)
    if match is None:
        return None
    domain, bus, device = match.group("pci").lower().split(":")
    return XidLine(
        xid=int(match.group("xid")),
        pci_bus=f"{domain[-4:].rjust(4, '0')}:{bus.rjust(2, '0')}:{device.rjust(2, '0')}",
    )


class KmsgReader:
    """Non-blocking reader of new kernel log records; call :meth:`poll` each tick."""

    def __init__(self, path: str, max_records: int = 2000) -> None:
        self.path = path
        self.max_records = max_records
        self._fd: int | None = None
        self._is_file = False
        self._buffer = b""
        self._position = 0
        self._retry_at = 0.0
        self.overruns = 0
        self.open_errors = 0
        self.read_errors = 0

    def _open(self, now: float) -> bool:
        if self._fd is not None:
            return True
        if now < self._retry_at:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self.open_errors += 1
            self._retry_at = now + REOPEN_AFTER_S
            if self.open_errors == 1 or exc.errno != errno.EACCES:
                log.warning("kmsg_open_failed", path=self.path, error=exc.strerror or str(exc))
            return False
        try:
            self._is_file = stat.S_ISREG(os.fstat(fd).st_mode)
            self._position = os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            self._position = 0
        self._fd = fd
        self._buffer = b""
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def poll(self, now: float) -> list[KmsgRecord]:
        """Records appended since the last call (at most ``max_records``); never raises."""
        if not self._open(now):
            return []
        assert self._fd is not None
        records: list[KmsgRecord] = []
        if self._is_file:
            self._check_truncation()
        while len(records) < self.max_records:
            try:
                chunk = os.read(self._fd, 65536 if self._is_file else MAX_RECORD_BYTES)
            except BlockingIOError:
                break
            except BrokenPipeError:
                self.overruns += 1  # the ring wrapped past us; the next read continues with what is left
                continue
            except OSError as exc:
                self.read_errors += 1
                log.warning("kmsg_read_failed", path=self.path, error=exc.strerror or str(exc))
                self.close()
                self._retry_at = now + REOPEN_AFTER_S
                break
            if not chunk:
                break
            self._position += len(chunk)
            records.extend(self._split(chunk))
        return records

    def _check_truncation(self) -> None:
        assert self._fd is not None
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            return
        if size < self._position:
            os.lseek(self._fd, 0, os.SEEK_SET)
            self._position = 0
            self._buffer = b""

    def _split(self, chunk: bytes) -> list[KmsgRecord]:
        data = self._buffer + chunk
        lines = data.split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > MAX_RECORD_BYTES:
            lines.append(self._buffer)
            self._buffer = b""
        out: list[KmsgRecord] = []
        for line in lines:
            record = parse_kmsg_record(line)
            if record is not None:
                out.append(record)
        return out


class XidDedup:
    """The same (GPU, Xid) reported by NVML and by the kernel log within ``window_s`` is one event."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[tuple[int, int], float] = {}

    def first(self, gpu: int, xid: int, t: float) -> bool:
        """True if this (gpu, xid) was not seen within the window (and remember it)."""
        key = (gpu, xid)
        last = self._last.get(key)
        if last is not None and abs(t - last) <= self.window_s:
            return False
        self._last[key] = t
        if len(self._last) > 4096:
            horizon = t - self.window_s
            self._last = {k: v for k, v in self._last.items() if v >= horizon}
        return True

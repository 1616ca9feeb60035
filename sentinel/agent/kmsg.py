"""The kernel log: ``/dev/kmsg`` read from a cursor in the state directory, surviving overruns and
permission errors.

A cursor (boot id + last sequence number) lets a restarted agent resume without loss or repeats on the
same boot, and read the whole ring of a new boot, so an Xid logged while the agent was down is still seen.
A ring overrun (EPIPE) is counted and skipped; without CAP_SYSLOG opening fails, is logged once and retried
while the rest of the agent works. :func:`parse_kmsg_record` is pure and fuzzed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from sentinel.log import get_logger

MAX_RECORD_BYTES = 8192
REOPEN_AFTER_S = 60.0

log = get_logger(module="agent.kmsg")

_PREFIX = re.compile(rb"^(\d{1,3}),(\d{1,20}),(\d{1,20}),[^;]{0,64};")


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record; priority/seq/ts are None for plain (non-kmsg) lines."""

    message: str
    priority: int | None = None
    seq: int | None = None
    ts_us: int | None = None


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


class KmsgReader:
    """Non-blocking reader of new kernel log records; call :meth:`poll` each tick."""

    def __init__(
        self,
        path: str,
        max_records: int = 2000,
        *,
        cursor_path: Path | None = None,
        boot_id: str | None = None,
    ) -> None:
        self.path = path
        self.max_records = max_records
        self.cursor_path = cursor_path
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self._skip_to_seq: int | None = None  # same boot: records up to this seq were read before the restart
        self._last_seq: int | None = None
        self.replayed = 0  # records read from the ring on start (new boot / first start / resumed cursor)
        self._fd: int | None = None
        self._is_file = False
        self._buffer = b""
        self._position = 0
        self._retry_at = 0.0
        self.overruns = 0
        self.open_errors = 0
        self.read_errors = 0

    @property
    def is_open(self) -> bool:
        return self._fd is not None

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
            self._position = self._start_position(fd)
        except OSError:
            self._position = 0
        self._fd = fd
        self._buffer = b""
        return True

    def _start_position(self, fd: int) -> int:
        """Where to start: the end without a cursor; else the saved place (same boot) or the ring's start."""
        if self.cursor_path is None:
            return os.lseek(fd, 0, os.SEEK_END)
        cursor = _load_cursor(self.cursor_path)
        same_boot = cursor is not None and bool(self.boot_id) and cursor.get("boot_id") == self.boot_id
        if self._is_file:
            offset = cursor.get("offset") if same_boot and cursor is not None else 0
            size = os.fstat(fd).st_size
            start = offset if isinstance(offset, int) and 0 <= offset <= size else 0
            return os.lseek(fd, start, os.SEEK_SET)
        seq = cursor.get("seq") if same_boot and cursor is not None else None
        self._skip_to_seq = seq if isinstance(seq, int) else None
        return os.lseek(fd, 0, os.SEEK_SET)  # the first record still in the ring

    def save_cursor(self) -> None:
        """Persist where we are (atomically: a crash leaves the old cursor or the new one, never half)."""
        if self.cursor_path is None or self._fd is None:
            return
        state: dict[str, object] = {"boot_id": self.boot_id}
        if self._is_file:
            state["offset"] = self._position - len(self._buffer)
        elif self._last_seq is not None:
            state["seq"] = self._last_seq
        else:
            return
        tmp = self.cursor_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.cursor_path)
        except OSError as exc:
            log.warning("kmsg_cursor_save_failed", path=str(self.cursor_path), error=exc.strerror or str(exc))

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
        skip = self._skip_to_seq
        for line in lines:
            record = parse_kmsg_record(line)
            if record is None:
                continue
            if record.seq is not None:
                if skip is not None and record.seq <= skip:
                    continue  # read before the restart
                self._last_seq = record.seq
            out.append(record)
        return out


def current_boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``, a dashed UUID); empty when unreadable."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _load_cursor(path: Path) -> dict[str, object] | None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text()[:4096])
        if isinstance(data, dict):
            return data
    return None

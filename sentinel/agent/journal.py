"""The kernel log from journald, for hosts where ``/dev/kmsg`` is not readable by the agent.

Under ``kernel.dmesg_restrict=1`` a member of ``systemd-journal`` can still read kernel records from
journald. This reader offers the kmsg reader's interface by following ``journalctl -k -o json -f`` in a
child process, resuming from a journald cursor saved in the state directory with the kmsg reader's rules
(same boot: after the cursor; new boot or first start: this boot's whole journal), so no Xid is lost across
restarts. A child that exits is counted, logged and restarted; every record and tick is bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from sentinel.agent.kmsg import KmsgReader, KmsgRecord, current_boot_id
from sentinel.log import get_logger
from sentinel.signals.kernel_source import MAX_RECORD_BYTES, cursor_boot, parse_journal_line

RESTART_AFTER_S: Final = 30.0
_READ_BYTES: Final = 1 << 20

log = get_logger(module="agent.journal")


def start_arguments(saved: str | None, boot_id: str, *, has_cursor_path: bool) -> tuple[list[str], str]:
    """The journalctl arguments that say where to start, and why (for the log): see the module docstring."""
    if not has_cursor_path:
        return ["--lines=0"], "no_state_dir"
    if saved is None:
        return ["--no-tail"], "no_cursor"
    boot = cursor_boot(saved)
    if boot is None:
        return ["--no-tail"], "cursor_not_understood"
    if boot != boot_id.replace("-", "").lower():
        return ["--no-tail"], "cursor_of_another_boot"
    return [f"--after-cursor={saved}"], "resume"


class JournalKernelReader:
    """Non-blocking reader of new kernel records from journald; call :meth:`poll` each tick."""

    def __init__(
        self,
        journalctl: str = "journalctl",
        max_records: int = 2000,
        *,
        cursor_path: Path | None = None,
        journal_args: Sequence[str] = (),
        boot_id: str | None = None,
    ) -> None:
        """``journal_args`` go before ours (``--directory=...`` for a journal kept elsewhere); ``boot_id``
        is this boot's (read from /proc when not given), the boot whose journal is read."""
        self.journalctl = journalctl
        self.journal_args = list(journal_args)
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.path = f"journald ({journalctl} -k)"
        self.max_records = max_records
        self.cursor_path = cursor_path
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._cursor: str | None = None
        self._retry_at = 0.0
        self.open_errors = 0
        self.read_errors = 0

    @property
    def is_open(self) -> bool:
        return self._process is not None

    def _start(self, now: float) -> bool:
        if self._process is not None:
            return True
        if now < self._retry_at:
            return False
        saved = self._load_cursor()
        where, why = start_arguments(saved, self.boot_id, has_cursor_path=self.cursor_path is not None)
        argv = [
            self.journalctl,
            *self.journal_args,
            "-k",
            "-b",
            "-o",
            "json",
            "-f",
            "--no-pager",
            "-q",
            *where,
        ]
        if why != "resume":
            log.info("journal_start", start="end" if why == "no_state_dir" else "whole_boot", reason=why)
        try:
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            self.open_errors += 1
            self._retry_at = now + RESTART_AFTER_S
            log.warning("journal_start_failed", command=self.journalctl, error=exc.strerror or str(exc))
            return False
        assert process.stdout is not None
        fd = process.stdout.fileno()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._process = process
        self._buffer = b""
        return True

    def poll(self, now: float) -> list[KmsgRecord]:
        """Records journald wrote since the last call (at most ``max_records``); never raises."""
        if not self._start(now):
            return []
        process = self._process
        assert process is not None and process.stdout is not None
        records: list[KmsgRecord] = []
        while len(records) < self.max_records:
            try:
                chunk = os.read(process.stdout.fileno(), _READ_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                self.read_errors += 1
                log.warning("journal_read_failed", error=exc.strerror or str(exc))
                chunk = b""
            if not chunk:
                self._exited(now)
                break
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            if len(self._buffer) > 4 * MAX_RECORD_BYTES:
                self._buffer = b""  # an over-long record is dropped, not held
            for raw in lines:
                line = parse_journal_line(raw)
                if line is None:
                    continue
                records.append(KmsgRecord(message=line.message))
                if line.cursor:
                    self._cursor = line.cursor
        return records

    def _exited(self, now: float) -> None:
        process = self._process
        self._process = None
        if process is None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            process.kill()
            process.wait(timeout=5)
        self.open_errors += 1
        self._retry_at = now + RESTART_AFTER_S
        log.warning("journal_follower_exited", command=self.journalctl, returncode=process.returncode)

    def save_cursor(self) -> None:
        """Persist the journald cursor of the last record handed over (atomically)."""
        if self.cursor_path is None or self._cursor is None:
            return
        tmp = self.cursor_path.with_suffix(".tmp")
        try:
            tmp.write_text(self._cursor[:1024], encoding="utf-8")
            os.replace(tmp, self.cursor_path)
        except OSError as exc:
            log.warning(
                "journal_cursor_save_failed", path=str(self.cursor_path), error=exc.strerror or str(exc)
            )

    def _load_cursor(self) -> str | None:
        if self.cursor_path is None:
            return None
        try:
            text = self.cursor_path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return None
        return text[:1024] if text and "\n" not in text else None

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                process.kill()
                process.wait(timeout=5)


def kernel_reader(
    path: str,
    max_records: int,
    *,
    cursor_path: Path | None = None,
    journal_cursor_path: Path | None = None,
    journalctl: str = "journalctl",
) -> KmsgReader | JournalKernelReader:
    """``/dev/kmsg`` when the agent may read it; else journald when ``journalctl`` is there; else the kmsg
    reader anyway (it reports the permission problem and retries)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        if shutil.which(journalctl) is not None:
            log.info("kmsg_not_readable_using_journal", path=path, command=journalctl)
            return JournalKernelReader(journalctl, max_records, cursor_path=journal_cursor_path)
    except OSError:
        pass
    else:
        os.close(fd)
    return KmsgReader(path, max_records, cursor_path=cursor_path)

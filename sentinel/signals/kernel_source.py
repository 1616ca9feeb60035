"""Where kernel log lines come from when nobody hands us a file: journald, ``dmesg``, or ``/dev/kmsg``.

``sentinel logs classify --kernel`` and the agent (when ``/dev/kmsg`` is not readable, e.g. without
CAP_SYSLOG under ``kernel.dmesg_restrict``) read the kernel's messages from the first source that works:

1. journald: ``journalctl -k -b -o json`` — the whole journal of this boot (of the newest boot in the
   files with ``--directory``), one JSON object per record with the message, the realtime timestamp (µs
   since the epoch) and the host name; readable by members of ``systemd-journal``/``adm``;
2. ``dmesg --time-format iso`` — the ring buffer as text with wall-clock stamps;
3. ``/dev/kmsg`` — ``<prio>,<seq>,<usec since boot>,...;message`` records, read until the ring is drained.

Each source yields :class:`KernelLine` (message, ISO 8601 UTC time when known, host when known). Every
record is bounded (:data:`MAX_RECORD_BYTES`) and so is the number read (:data:`MAX_RECORDS`); a source that
fails is reported by :class:`KernelSourceError` naming every source tried, never silently empty.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

MAX_RECORD_BYTES: Final = 8192
MAX_RECORDS: Final = 1_000_000
_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class KernelLine:
    """One kernel message with where and when it happened, when the source says."""

    message: str
    time: str | None = None
    host: str | None = None
    #: The journald cursor of this record (journald only): where to resume after it.
    cursor: str | None = None


class KernelSourceError(Exception):
    """No kernel log source could be read (the message names each source and why)."""


class _JournalRecord(msgspec.Struct):
    message: str | list[int] | None = msgspec.field(default=None, name="MESSAGE")
    boot_id: str | None = msgspec.field(default=None, name="_BOOT_ID")
    realtime_us: str | None = msgspec.field(default=None, name="__REALTIME_TIMESTAMP")
    hostname: str | None = msgspec.field(default=None, name="_HOSTNAME")
    cursor: str | None = msgspec.field(default=None, name="__CURSOR")


_JOURNAL_DECODER: Final = msgspec.json.Decoder(_JournalRecord)

# s=<seqnum id>;i=<seqnum>;b=<boot id>;m=<monotonic>;t=<realtime>;x=<xor hash>, all hex (sd_journal_get_cursor).
_CURSOR_RE: Final = re.compile(
    r"^s=[0-9a-f]{32};i=[0-9a-f]{1,16};b=([0-9a-f]{32});m=[0-9a-f]{1,16};t=[0-9a-f]{1,16};x=[0-9a-f]{1,16}$"
)


def cursor_boot(cursor: str) -> str | None:
    """The boot id (32 hex digits) a journald cursor was taken in; ``None`` for what is not a cursor."""
    match = _CURSOR_RE.match(cursor)
    return match.group(1) if match is not None else None


def iso_from_epoch_us(value: int) -> str:
    """``1732992000123456`` → ``2024-11-30T18:40:00.123456Z``."""
    stamp = dt.datetime.fromtimestamp(value / 1e6, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_journal_line(raw: bytes) -> KernelLine | None:
    """One ``journalctl -o json`` line → a :class:`KernelLine`; ``None`` for what is not a record."""
    if not raw.strip() or len(raw) > 4 * MAX_RECORD_BYTES:
        return None
    try:
        record = _JOURNAL_DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    message = record.message
    if isinstance(message, list):  # journald sends non-UTF-8 messages as a byte array
        message = bytes(b & 0xFF for b in message[:MAX_RECORD_BYTES]).decode("utf-8", "replace")
    if not message:
        return None
    when: str | None = None
    if record.realtime_us and record.realtime_us.isdigit() and len(record.realtime_us) <= 20:
        try:
            when = iso_from_epoch_us(int(record.realtime_us))
        except (OverflowError, OSError, ValueError):
            when = None
    host = record.hostname[:255] if record.hostname else None
    return KernelLine(message=message[:MAX_RECORD_BYTES], time=when, host=host, cursor=record.cursor)


def parse_kmsg_line(raw: bytes, boot_epoch_s: float | None) -> KernelLine | None:
    """One ``/dev/kmsg`` record → a :class:`KernelLine` (time from the boot time when known)."""
    if not raw or raw[:1] == b" ":
        return None  # continuation lines (SUBSYSTEM=..., DEVICE=...)
    head, sep, body = raw[:MAX_RECORD_BYTES].partition(b";")
    fields = head.split(b",")
    if not sep or len(fields) < 3 or not fields[2].isdigit():
        text = raw[:MAX_RECORD_BYTES].decode("utf-8", "replace").strip()
        return KernelLine(message=text) if text else None
    when = None
    if boot_epoch_s is not None and len(fields[2]) <= 20:
        when = iso_from_epoch_us(int(boot_epoch_s * 1e6) + int(fields[2]))
    message = body.decode("utf-8", "replace").rstrip()
    return KernelLine(message=message, time=when) if message else None


def boot_epoch_s(proc_stat: str = "/proc/stat") -> float | None:
    """When this machine booted (``btime`` of /proc/stat), seconds since the epoch."""
    try:
        with open(proc_stat, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("btime "):
                    value = line.split()[1]
                    return float(value) if value.isdigit() else None
    except OSError:
        return None
    return None


def _run(argv: list[str]) -> Iterator[bytes]:
    """Lines of a command's output, bounded in count and length; raises OSError when it fails."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    ) as process:
        assert process.stdout is not None
        produced = False
        for count, raw in enumerate(process.stdout, start=1):
            produced = True
            yield raw[: MAX_RECORD_BYTES * 4].rstrip(b"\n")
            if count >= MAX_RECORDS:
                process.kill()
                return
        try:
            _, err = process.communicate(timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            raise OSError(errno.ETIMEDOUT, f"{argv[0]} did not finish") from None
        if process.returncode != 0 or (not produced and err.strip()):
            reason = err.decode("utf-8", "replace").strip().splitlines()
            raise OSError(
                errno.EIO, f"{' '.join(argv)}: {reason[-1] if reason else f'exit {process.returncode}'}"
            )


def journal_lines(
    journalctl: str = "journalctl", *, after_cursor: str | None = None, journal_args: Sequence[str] = ()
) -> Iterator[KernelLine]:
    """The kernel's records from journald, oldest first: every record of this boot, or those after
    ``after_cursor``. ``journal_args`` go first (``--directory=DIR`` for a journal copied off a host)."""
    argv = [journalctl, *journal_args, "-k", "-b", "-o", "json", "--no-pager", "-q"]
    if after_cursor:
        argv.append(f"--after-cursor={after_cursor}")
    for raw in _run(argv):
        line = parse_journal_line(raw)
        if line is not None:
            yield line


def journal_boot(journalctl: str = "journalctl", *, journal_args: Sequence[str] = ()) -> str | None:
    """The boot whose kernel records ``journal_lines`` reads (this boot; with ``--directory``, the newest
    boot in those files): the boot id of its last kernel record, ``None`` when there is none."""
    boot: str | None = None
    for raw in _run([journalctl, *journal_args, "-k", "-b", "-n", "1", "-o", "json", "--no-pager", "-q"]):
        try:
            boot = _JOURNAL_DECODER.decode(raw).boot_id
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return boot.lower() if boot and len(boot) == 32 else None


def dmesg_lines(dmesg: str = "dmesg") -> Iterator[KernelLine]:
    """The ring buffer through ``dmesg --time-format iso`` (the stamp stays at the head of the message)."""
    for raw in _run([dmesg, "--time-format", "iso"]):
        text = raw.decode("utf-8", "replace").rstrip()
        if text:
            yield KernelLine(message=text)


def kmsg_lines(path: str = "/dev/kmsg") -> Iterator[KernelLine]:
    """Every record still in the ring, read from ``/dev/kmsg`` without blocking (or a plain file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    boot = boot_epoch_s()
    try:
        is_file = os.path.isfile(path)
        buffer = b""
        for _ in range(MAX_RECORDS):
            try:
                chunk = os.read(fd, 65536 if is_file else MAX_RECORD_BYTES)
            except BlockingIOError:
                break  # drained
            except BrokenPipeError:
                continue  # the ring wrapped past us: carry on with the oldest record left
            if not chunk:
                break
            buffer += chunk
            *records, buffer = buffer.split(b"\n")
            for raw in records:
                line = parse_kmsg_line(raw, boot)
                if line is not None:
                    yield line
            if len(buffer) > MAX_RECORD_BYTES:
                buffer = b""
        if buffer:
            line = parse_kmsg_line(buffer, boot)
            if line is not None:
                yield line
    finally:
        os.close(fd)


def kernel_lines(
    source: str = "auto",
    *,
    journalctl: str = "journalctl",
    dmesg: str = "dmesg",
    kmsg: str = "/dev/kmsg",
    journal_args: Sequence[str] = (),
    after_cursor: str | None = None,
) -> tuple[str, Iterator[KernelLine]]:
    """``(name, lines)`` of the first source that can be read: journald, then dmesg, then /dev/kmsg.

    The first record is read before answering, so a source that fails at once (no journal, dmesg
    restricted, kmsg not readable) is skipped rather than returned empty — except journald read after a
    cursor, where no record means nothing new.
    """
    order = ("journal", "dmesg", "kmsg") if source == "auto" else (source,)
    reasons: list[str] = []
    for name in order:
        if name == "journal" and shutil.which(journalctl) is None:
            reasons.append(f"journal: {journalctl} not found")
            continue
        if name == "dmesg" and shutil.which(dmesg) is None:
            reasons.append(f"dmesg: {dmesg} not found")
            continue
        try:
            lines = (
                journal_lines(journalctl, journal_args=journal_args, after_cursor=after_cursor)
                if name == "journal"
                else dmesg_lines(dmesg)
                if name == "dmesg"
                else kmsg_lines(kmsg)
            )
            first = next(lines, None)
        except OSError as exc:
            reasons.append(f"{name}: {exc.strerror or exc}")
            continue
        if first is None and name == "journal" and after_cursor:
            return name, iter(())
        if first is None:
            reasons.append(f"{name}: no records")
            continue
        return name, _prepend(first, lines)
    raise KernelSourceError("no kernel log source could be read (" + "; ".join(reasons) + ")")


def _prepend(first: KernelLine, rest: Iterator[KernelLine]) -> Iterator[KernelLine]:
    yield first
    yield from rest

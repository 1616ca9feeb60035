"""``sentinel logs classify``: kernel (Xid), NCCL and PyTorch log lines to JSON Lines events.

Raw mode reads log files (or stdin ``-``; gzip recognised by its magic bytes, whatever the name) through
the chunked fast path and prints one object per event, skipping plain chatter unless ``--all``.
``--records`` reads JSON Lines ``{"text": ...}`` and prints exactly one object per record, in order: the
most severe event of that record. ``--kernel`` reads the kernel log itself (journald, else ``dmesg``,
else ``/dev/kmsg``: :mod:`sentinel.signals.kernel_source`); from journald the whole current boot, or
with ``--cursor-file`` only what came after the saved cursor of that boot. Raw and kernel objects carry the line's own
``time`` and ``host`` when it has them. See ``docs/contracts.md`` §2 and ``docs/signals.md``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

import msgspec

from sentinel.signals.classify import classify_line, classify_text, line_events
from sentinel.signals.kernel_source import KernelSourceError, cursor_boot, journal_boot, kernel_lines
from sentinel.signals.record import Classified, make_event, most_severe
from sentinel.signals.scan import CHUNK_SIZE, LogScanner
from sentinel.signals.stamp import line_stamp

_GZIP_MAGIC = b"\x1f\x8b"
#: A --records line longer than this is refused (bounded memory; a record is a line or a short block).
MAX_RECORD_BYTES = 4 * 1024 * 1024


class InputError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _RecordIn(msgspec.Struct):
    text: str


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``logs`` and its ``classify`` sub-command."""
    parser = subparsers.add_parser(
        "logs",
        help="classify kernel (Xid), NCCL and PyTorch log lines",
        description="Classify kernel (Xid), NCCL and PyTorch log lines into JSON Lines events.",
    )
    sub = parser.add_subparsers(dest="logs_command", metavar="SUBCOMMAND")
    classify = sub.add_parser(
        "classify",
        help="print one JSON object per event found in log text",
        description="Raw mode: one JSON object per event in FILEs (plain noise skipped unless --all). "
        '--records: exactly one object per {"text": ...} record, the most severe event in it.',
    )
    classify.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="log files to read ('-' = stdin, the default); gzip is detected",
    )
    classify.add_argument(
        "--records",
        metavar="FILE.jsonl",
        help='read JSON Lines records {"text": ...} instead of raw log text',
    )
    classify.add_argument(
        "--all",
        action="store_true",
        help="raw mode: also print lines that carry no signal (as kind other/info)",
    )
    classify.add_argument(
        "--kernel",
        action="store_true",
        help="read the kernel log itself: journald (journalctl -k) when present, else dmesg, else /dev/kmsg",
    )
    classify.add_argument(
        "--kernel-source",
        choices=("auto", "journal", "dmesg", "kmsg"),
        default="auto",
        help="with --kernel: which source to read (default: the first that works)",
    )
    classify.add_argument(
        "--journal-directory",
        metavar="DIR",
        help="with --kernel: read the journal files in DIR (journalctl --directory, e.g. a copy of a "
        "host's /var/log/journal) instead of this machine's; implies --kernel-source journal",
    )
    classify.add_argument(
        "--cursor-file",
        metavar="FILE",
        help="with --kernel: read journald after the cursor saved in FILE (when it is of the boot being "
        "read; else the whole boot) and save the last record's cursor there: each run prints only what "
        "is new; implies --kernel-source journal",
    )
    classify.add_argument(
        "--kmsg-path",
        default="/dev/kmsg",
        help="with --kernel: the kmsg device (a plain file works for tests)",
    )
    classify.set_defaults(func=run)
    parser.set_defaults(func=_usage(parser))


def _usage(parser: argparse.ArgumentParser) -> object:
    def run_usage(_: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return run_usage


def run(args: argparse.Namespace) -> int:
    """Entry point of ``sentinel logs classify``."""
    out = sys.stdout.buffer
    try:
        if args.kernel:
            if args.files or args.records is not None:
                raise InputError("--kernel reads the kernel log; give no FILEs or --records with it")
            source, journal_args = args.kernel_source, []
            if args.journal_directory is not None:
                source, journal_args = "journal", [f"--directory={args.journal_directory}"]
            if args.cursor_file is not None:
                source = "journal"
            _run_kernel(
                source,
                args.kmsg_path,
                out,
                include_all=args.all,
                journal_args=journal_args,
                cursor_file=Path(args.cursor_file) if args.cursor_file is not None else None,
            )
        elif args.records is not None:
            if args.files:
                raise InputError("give either --records FILE.jsonl or raw FILEs, not both")
            _run_records(args.records, out)
        else:
            _run_raw(args.files or ["-"], out, include_all=args.all)
    except InputError as exc:
        out.flush()
        print(f"sentinel logs classify: {exc}", file=sys.stderr)
        return 2
    out.flush()
    return 0


@contextmanager
def _open(path: str) -> Iterator[BinaryIO]:
    """Open a file or stdin for binary reading, transparently un-gzipping by magic bytes."""
    try:
        raw: BinaryIO = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(io.RawIOBase, raw))
        try:
            magic = buffered.peek(2)[:2]
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        opened = gzip.GzipFile(fileobj=buffered, mode="rb") if magic == _GZIP_MAGIC else buffered
        stream = cast(BinaryIO, opened)
        yield stream
    finally:
        if path != "-":
            raw.close()


def _read_chunks(path: str, stream: BinaryIO) -> Iterator[bytes]:
    while True:
        try:
            chunk = stream.read(CHUNK_SIZE)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from None
        if not chunk:
            return
        yield chunk


def _run_raw(paths: list[str], out: BinaryIO, *, include_all: bool) -> None:
    encoder = msgspec.json.Encoder()
    buffer = bytearray()
    for path in paths:
        scanner = LogScanner(include_all=include_all)
        with _open(path) as stream:
            for chunk in _read_chunks(path, stream):
                _emit(scanner.feed(chunk), encoder, buffer, out)
        _emit(scanner.finish(), encoder, buffer, out)


def _resume_cursor(cursor_file: Path, journal_args: list[str]) -> str | None:
    """The saved cursor when it belongs to the boot about to be read (else the whole boot is read: a
    cursor of an earlier boot handed to --after-cursor makes journalctl skip the new boot's first record)."""
    try:
        saved = cursor_file.read_text(encoding="utf-8", errors="replace")[:1024].strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{cursor_file}: cannot read: {exc.strerror or exc}") from None
    boot = cursor_boot(saved)
    try:
        current = journal_boot(journal_args=journal_args) if boot is not None else None
    except OSError as exc:
        raise InputError(f"journal: {exc.strerror or exc}") from None
    if boot is None or boot != current:
        why = "not a journald cursor" if boot is None else "of another boot"
        print(f"sentinel logs classify: the saved cursor is {why}: reading the whole boot", file=sys.stderr)
        return None
    return saved


def _save_cursor(cursor_file: Path, cursor: str) -> None:
    tmp = cursor_file.with_name(cursor_file.name + ".tmp")
    try:
        tmp.write_text(cursor[:1024], encoding="utf-8")
        os.replace(tmp, cursor_file)
    except OSError as exc:
        raise InputError(f"{cursor_file}: cannot write: {exc.strerror or exc}") from None


def _run_kernel(
    source: str,
    kmsg_path: str,
    out: BinaryIO,
    *,
    include_all: bool,
    journal_args: list[str],
    cursor_file: Path | None = None,
) -> None:
    """Classify the kernel's own log; each object keeps the record's time and host. With a cursor file,
    only what journald holds after the saved cursor, and the last record's cursor is saved."""
    after = _resume_cursor(cursor_file, journal_args) if cursor_file is not None else None
    try:
        name, lines = kernel_lines(source, kmsg=kmsg_path, journal_args=journal_args, after_cursor=after)
    except KernelSourceError as exc:
        raise InputError(str(exc)) from None
    print(f"sentinel logs classify: reading the kernel log from {name}", file=sys.stderr)
    last_cursor: str | None = None
    encoder = msgspec.json.Encoder()
    buffer = bytearray()
    batch: list[Classified] = []
    try:
        for number, record in enumerate(lines, start=1):
            last_cursor = record.cursor or last_cursor
            event = _kernel_event(record.message, include_all=include_all)
            if event is None:
                continue
            stamp, host = line_stamp(record.message)
            batch.append(
                msgspec.structs.replace(
                    event,
                    line=number,
                    time=record.time or stamp,
                    host=event.host or record.host or host,
                )
            )
            if len(batch) >= 256:
                _emit(batch, encoder, buffer, out)
                batch = []
    except OSError as exc:
        raise InputError(f"kernel log ({name}): {exc.strerror or exc}") from None
    _emit(batch, encoder, buffer, out)
    if cursor_file is not None and last_cursor is not None:
        _save_cursor(cursor_file, last_cursor)


def _kernel_event(message: str, *, include_all: bool) -> Classified | None:
    if not include_all:
        return classify_line(message)
    best = most_severe(line_events(message))
    return best if best is not None else make_event("other", "info")


def _emit(events: list[Classified], encoder: msgspec.json.Encoder, buffer: bytearray, out: BinaryIO) -> None:
    if not events:
        return
    buffer.clear()
    for event in events:
        encoder.encode_into(event, buffer, len(buffer))
        buffer.extend(b"\n")
    out.write(buffer)


def _run_records(path: str, out: BinaryIO) -> None:
    encoder = msgspec.json.Encoder()
    decoder = msgspec.json.Decoder(_RecordIn)
    with _open(path) as stream:
        for number, raw_line in enumerate(_record_lines(path, stream), start=1):
            if not raw_line.strip():
                continue
            if len(raw_line) > MAX_RECORD_BYTES:
                raise InputError(f"{path}:{number}: record longer than {MAX_RECORD_BYTES} bytes")
            try:
                record = decoder.decode(raw_line.decode("utf-8", "replace"))
            except msgspec.ValidationError as exc:
                raise InputError(f"{path}:{number}: bad record: {exc}") from None
            except msgspec.DecodeError as exc:
                raise InputError(f"{path}:{number}: not a JSON object: {exc}") from None
            out.write(encoder.encode(classify_text(record.text)) + b"\n")


def _record_lines(path: str, stream: BinaryIO) -> Iterator[bytes]:
    while True:
        try:
            line = stream.readline(MAX_RECORD_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from None
        if not line:
            return
        if len(line) > MAX_RECORD_BYTES:
            raise InputError(f"{path}: record longer than {MAX_RECORD_BYTES} bytes")
        yield line

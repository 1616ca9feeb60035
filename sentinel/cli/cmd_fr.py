"""``sentinel fr``: PyTorch Flight Recorder dump analysis (contract: docs/contracts.md §3)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import SimpleNamespace

from sentinel.fr.dumpset import RECENT_ENTRIES, analyze_dir
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import as_pathlib_text
from sentinel.fr.records import TYPE_CHECKING
from sentinel.fr.verdict import FrAnalysis
from sentinel.fr.workers import TerminalProgress, reap_workers

if TYPE_CHECKING:
    import argparse
    from typing import Any


def non_negative_int(text: str) -> int:
    """``--workers N``: an integer, 0 (decode in this process) or more; argparse names a refused value."""
    n = int(text)
    if n < 0:
        raise ValueError(text)
    return n


EXIT_OK = 0
EXIT_BAD_INPUT = 2
#: ``fr analyze``'s options as :func:`parse_fast` reads them: option -> (attribute, conversion); None: a flag.
_ANALYZE_OPTIONS: dict[str, tuple[str, Any]] = {
    "--json": ("json", None),
    "--all-entries": ("all_entries", None),
    "--workers": ("workers", non_negative_int),
    "--progress-after": ("progress_after", float),
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "fr",
        help="analyze PyTorch Flight Recorder dumps of every rank",
        description="Analyze PyTorch Flight Recorder dumps (pickle or JSON, any 2.x format, gzip allowed).",
    )
    sub = p.add_subparsers(dest="fr_command", metavar="SUBCOMMAND")
    a = sub.add_parser(
        "analyze",
        help="find who stalls a job from every rank's dump",
        description="Read every rank's dump under DIR (files <prefix><rank>[.json][.gz], also in per-host "
        "subfolders) without executing anything, and print the verdict (healthy, hang, mismatch, crash, "
        "straggler, inconclusive), the culprit ranks root cause first, and the evidence. Exit 0 when the "
        "analysis ran, 2 when the input is unusable.",
    )
    a.add_argument("dir", metavar="DIR", type=as_pathlib_text, help="directory holding the dumps of one job")
    a.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a.add_argument(
        "--workers",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="worker processes for decoding large dump sets (default: number of CPUs, at most 32)",
    )
    a.add_argument(
        "--all-entries",
        action="store_true",
        help="decode every ring-buffer entry of every dump; by default large pickle dumps are read for "
        f"their newest {RECENT_ENTRIES} entries and pg_status only, when those hold every collective a "
        "group still waits in",
    )
    a.add_argument(
        "--progress-after",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="on a terminal, show progress (dumps read and decoded) on stderr once the analysis has run "
        "this long (default: 1); never when stderr is not a terminal",
    )
    a.set_defaults(func=run_analyze, exit_at_once=True)
    p.set_defaults(func=_usage(p))


def parse_fast(args: list[str]) -> SimpleNamespace | None:
    """``fr analyze DIR [--json] [--all-entries] [--workers N] [--progress-after SECONDS]`` read without
    argparse (see :mod:`sentinel.cli`): the options of :func:`register` spelled out in full, alone or as
    ``--option=value``, in any order, repeated (the last counts), one DIR. None for anything else — help, an
    abbreviation, ``--``, a value or a DIR that starts with ``-``, a value the conversion refuses, no DIR
    or two — which argparse then reads and answers as it always did. The same conversions give the same
    values argparse would."""
    if args[:1] != ["analyze"]:
        return None
    values: dict[str, Any] = {
        "json": False,
        "all_entries": False,
        "workers": None,
        "progress_after": 1.0,
    }
    folder: str | None = None
    rest = iter(args[1:])
    for token in rest:
        if not token.startswith("-"):
            if folder is not None:
                return None
            folder = token
            continue
        option, eq, value = token.partition("=")
        known = _ANALYZE_OPTIONS.get(option)
        if known is None:
            return None
        attr, convert = known
        if convert is None:
            if eq:
                return None
            values[attr] = True
            continue
        if not eq:
            value = next(rest, "-")
        if value.startswith("-"):
            return None
        try:
            values[attr] = convert(value)
        except (TypeError, ValueError):
            return None
    if folder is None:
        return None
    return SimpleNamespace(
        command="fr",
        fr_command="analyze",
        dir=as_pathlib_text(folder),
        **values,
        func=run_analyze,
        exit_at_once=True,
    )


def _usage(parser: argparse.ArgumentParser) -> Any:
    def run(_: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT

    return run


def run_analyze(args: argparse.Namespace | SimpleNamespace) -> int:
    """Analyze, never with a traceback: the analysis (exit 0) or one escaped line naming what is wrong
    (exit 2). SIGTERM stops the decoding workers at once (exit 143)."""
    progress = TerminalProgress(sys.stderr, after_s=args.progress_after) if sys.stderr.isatty() else None
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(_signum: int, _frame: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)  # unwinds through the pool, which kills its workers

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        result = analyze_dir(
            args.dir,
            workers=args.workers,
            recent=None if args.all_entries else RECENT_ENTRIES,
            progress=progress,
            aside=args.workers != 0,  # the straggler lags on the other core (--workers 0: one process)
        )
    except FrFormatError as exc:
        _finish(progress)
        print(f"sentinel fr analyze: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (MemoryError, RecursionError, OverflowError, ValueError, OSError) as exc:
        _finish(progress)
        print(
            f"sentinel fr analyze: {terminal_safe(str(args.dir))}: cannot analyze: {type(exc).__name__}: "
            f"{terminal_safe(str(exc)[:200])}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    _finish(progress)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(terminal_safe(render_text(result)))
    reap_workers()
    return EXIT_OK


def _finish(progress: TerminalProgress | None) -> None:
    if progress is not None:
        progress.finish()


def terminal_safe(text: str) -> str:
    """``text`` with every control character (ESC, CR, BEL, C1, bidi overrides, ...) but newline shown as
    an escape: file names and ``pg_desc`` come from the dumps and must not drive the terminal."""
    return "\n".join(
        line if line.isprintable() else "".join(map(_safe_char, line)) for line in text.split("\n")
    )


def _safe_char(c: str) -> str:
    return c if c.isprintable() else c.encode("unicode_escape").decode("ascii")


def render_text(result: FrAnalysis) -> str:
    """Verdict sentence first, then the evidence."""
    lines = [result.summary]
    if result.culprit_ranks:
        lines.append(f"culprit ranks (root cause first): {', '.join(map(str, result.culprit_ranks))}")
    if result.collective:
        c = result.collective
        desc = f" ({c['pg_desc']})" if c["pg_desc"] else ""
        lines.append(f"collective: {c['op']} #{c['seq']} of process group {c['pg_name']}{desc}")
    if result.missing_dumps:
        lines.append(f"missing dumps: {', '.join(map(str, result.missing_dumps))}")
    lines.append(
        f"read {result.ranks_with_dumps} dump(s) of world size {result.world_size}, {result.entries} entries, "
        f"format {', '.join(result.versions)}"
    )
    if result.findings:
        lines.append("evidence:")
        lines.extend(f"  - {f}" for f in result.findings)
    return "\n".join(lines)

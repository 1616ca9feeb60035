"""The argparse side of the ``sentinel`` command line: the parser of every command (or of one).

Imported only when a command is not read by its module's ``parse_fast`` (see :mod:`sentinel.cli`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

from sentinel import __version__
from sentinel.cli import COMMANDS, _load_registrar


class _Registrar(Protocol):
    def __call__(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


def _not_available(command: str) -> Callable[[argparse.Namespace], int]:
    def run(_: argparse.Namespace) -> int:
        print(f"sentinel {command}: not available in this version yet", file=sys.stderr)
        return 2

    return run


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter with its width found as :func:`shutil.get_terminal_size` finds it:
    argparse imports shutil for that (bz2 and lzma with it) on every parser it builds, which a
    one-shot command like ``fr analyze`` of a small set would pay for a help text it never prints."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(
            prog, indent_increment, max_help_position, _columns() - 2 if width is None else width
        )


def _columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help formatter defaults to :class:`_Formatter` (subcommands' parsers are of
    the same class: argparse makes them ``type(parent)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; commands without an implementation are marked as coming.

    With ``only``, just that command is added: a command like ``logs classify`` must not pay for
    importing the aggregator, torch helpers and so on, nor for a parser per other command (argparse looks
    up translations with file system probes for each, a cost a small ``fr analyze`` should not pay).
    """
    parser: argparse.ArgumentParser = _Parser(
        prog="sentinel",
        description="GPU-cluster observability and fault detection. "
        "Finds the faulty, stuck or slow GPU that stalls a training job.",
    )
    parser.add_argument("--version", action="version", version=f"sentinel {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, help_text in COMMANDS:
        if only not in (None, command):
            continue
        registrar: _Registrar | None = _load_registrar(command)
        if registrar is None:
            sub = subparsers.add_parser(command, help=f"(coming) {help_text}", description=help_text)
            sub.set_defaults(func=_not_available(command))
        else:
            registrar(subparsers)
    return parser

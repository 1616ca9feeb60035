"""The ``sentinel`` command line.

Every top-level command lives in its own module ``sentinel.cli.cmd_<name>`` exposing
``register(subparsers) -> None``, which adds its parser and sets ``func`` (a callable taking the parsed
namespace and returning the exit code). A command whose module does not exist yet is listed in ``--help``
as coming and refuses to run, so nothing pretends to work before it does.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sentinel import __version__

#: (command, one-line help) in the order ``--help`` shows them; see ../shared/CONTRACTS.md.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("agent", "run the per-host agent (NVML, Xid, logs, flight recorder) and stream to the aggregator"),
    ("aggregator", "run the cluster-side aggregator: ingest, detectors, verdicts, incidents, API"),
    ("sim", "run a fault scenario on a simulated cluster with a virtual clock and write a report"),
    ("demo", "run a simulated cluster against a real aggregator on 127.0.0.1 with injected faults"),
    ("logs", "classify kernel (Xid), NCCL and PyTorch log lines"),
    ("fr", "analyze PyTorch Flight Recorder dumps of every rank"),
    ("dashboards", "build the Grafana dashboards from their grafanalib sources"),
    ("incident", "list and show incident timelines gathered by the aggregator"),
    ("health", "is this node fit? ask the local agent (Slurm HealthCheckProgram, prolog/epilog, launchers)"),
    ("fleet", "one read-only view (API, status page, verdicts) over several aggregators"),
    ("config", "check and document configuration files"),
)


class _Registrar(Protocol):
    def __call__(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


def _module_name(command: str) -> str:
    return f"sentinel.cli.cmd_{command}"


def _load_registrar(command: str) -> _Registrar | None:
    name = _module_name(command)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise
    registrar: _Registrar = module.register
    return registrar


def _not_available(command: str) -> Callable[[argparse.Namespace], int]:
    def run(_: argparse.Namespace) -> int:
        print(f"sentinel {command}: not available in this version yet", file=sys.stderr)
        return 2

    return run


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter with its width found as :func:`shutil.get_terminal_size` finds it:
    argparse imports shutil for that (bz2 and lzma with it, ~2 ms) on every parser it builds, which a
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
    up translations with file system probes for each: 30 of them were 3 ms of a small ``fr analyze``).
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
        registrar = _load_registrar(command)
        if registrar is None:
            sub = subparsers.add_parser(command, help=f"(coming) {help_text}", description=help_text)
            sub.set_defaults(func=_not_available(command))
        else:
            registrar(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sentinel`` console script (``argv`` None: this process is the program).

    A command that sets ``exit_at_once`` (``sentinel fr analyze``) ends the program as soon as its output
    is flushed, without tearing down the objects it built one by one: freeing the summaries of 512 dumps
    cost a tenth of the analysis. Only when ``argv`` is None: a caller that passes it keeps its process."""
    rc, exit_at_once = _run(argv)
    if argv is None and exit_at_once:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            pass
        os._exit(rc)
    return rc


def _run(argv: Sequence[str] | None) -> tuple[int, bool]:
    """(exit code, whether the command asked to exit at once)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = args_list[0] if args_list else None
    parser = build_parser(only=first if first in dict(COMMANDS) else None)
    args = parser.parse_args(args_list)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2, False
    exit_at_once = bool(getattr(args, "exit_at_once", False))
    if argv is None and exit_at_once:
        # the program ends at once after the command: the cyclic collector would only rescan what the
        # command built (re-enabled after fr analyze's decode, its first pass over the summaries of 512
        # dumps cost 3 ms for nothing)
        gc.disable()
    try:
        return func(args), exit_at_once
    except KeyboardInterrupt:
        return 130, exit_at_once
    except BrokenPipeError:
        return 0, exit_at_once

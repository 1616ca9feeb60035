"""The ``sentinel`` command line.

Every top-level command lives in its own module ``sentinel.cli.cmd_<name>`` exposing
``register(subparsers) -> None``, which adds its parser and sets ``func`` (a callable taking the parsed
namespace and returning the exit code). A command whose module does not exist yet is listed in ``--help``
as coming and refuses to run, so nothing pretends to work before it does.

A command module may also expose ``parse_fast(args) -> namespace | None``, which reads the command's
arguments (those after its name) without argparse when they are spelled plainly, and returns None for
anything else, which argparse then reads as always: ``fr analyze`` of a small set is a one-shot process
whose start is a large share of its time, and argparse (its import with gettext and locale, the parsers,
their translation look-ups) is a large share of that start. The argparse side lives in :mod:`sentinel.cli.parsing`.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from typing import Any

#: (command, one-line help) in the order ``--help`` shows them; see docs/contracts.md.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("agent", "run the per-host agent (NVML, Xid, logs, flight recorder) and stream to the aggregator"),
    ("aggregator", "run the cluster-side aggregator: ingest, detectors, verdicts, incidents, API"),
    ("sim", "run a fault scenario on a simulated cluster with a virtual clock and write a report"),
    ("demo", "run a simulated cluster against a real aggregator on 127.0.0.1 with injected faults"),
    ("logs", "classify kernel (Xid), NCCL and PyTorch log lines"),
    ("fr", "analyze PyTorch Flight Recorder dumps of every rank"),
    ("dashboards", "build the Grafana dashboards from their grafanalib sources"),
    ("rules", "build the Prometheus alert and recording rules from their owners' declarations"),
    ("incident", "list and show incident timelines gathered by the aggregator"),
    ("health", "is this node fit? ask the local agent (Slurm HealthCheckProgram, prolog/epilog, launchers)"),
    ("fleet", "one read-only view (API, status page, verdicts) over several aggregators"),
    ("config", "check and document configuration files"),
)


def _module_name(command: str) -> str:
    return f"sentinel.cli.cmd_{command}"


def _load_module(command: str) -> ModuleType | None:
    name = _module_name(command)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def _load_registrar(command: str) -> Any:
    """The command's ``register(subparsers)``, or None where its module does not exist yet."""
    module = _load_module(command)
    return None if module is None else module.register


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser (see :func:`sentinel.cli.parsing.build_parser`)."""
    from sentinel.cli.parsing import build_parser as build

    return build(only)


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
    module = _load_module(first) if first in dict(COMMANDS) else None
    parse_fast: Callable[[list[str]], Any] | None = getattr(module, "parse_fast", None)
    args = None if parse_fast is None else parse_fast(args_list[1:])
    if args is None:
        parser = build_parser(only=first if first in dict(COMMANDS) else None)
        args = parser.parse_args(args_list)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2, False
    func: Callable[[Any], int] = args.func
    exit_at_once = bool(getattr(args, "exit_at_once", False))
    if argv is None and exit_at_once:
        # the program ends at once after the command: the cyclic collector would only rescan what the
        # command built (re-enabled after fr analyze's decode, its first pass over the summaries would be
        # work for nothing)
        gc.disable()
    try:
        return func(args), exit_at_once
    except KeyboardInterrupt:
        return 130, exit_at_once
    except BrokenPipeError:
        return 0, exit_at_once

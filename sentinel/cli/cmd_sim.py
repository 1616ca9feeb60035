"""``sentinel sim SCENARIO.toml --report REPORT.json``: a fault scenario on a simulated cluster, virtual clock.

Deterministic for a given seed; the report is JSON: the scenario, the faults as
injected and each verdict when it opened (format: docs/scenarios.md). Runs as fast as the CPU allows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sentinel.config import ConfigError, load_aggregator_config
from sentinel.log import LEVELS, setup_logging
from sentinel.sim.runner import run_scenario
from sentinel.sim.scenario import ScenarioError, load_scenario

DESCRIPTION = """sentinel sim SCENARIO.toml --report REPORT.json: a fault scenario on a simulated cluster, virtual clock.

Deterministic for a given seed; the report is JSON: the scenario, the faults as
injected and each verdict when it opened (format: docs/scenarios.md). Runs as fast as the CPU allows.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run a fault scenario on a simulated cluster with a virtual clock and write a report",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", type=Path, help="scenario file (TOML, see docs/scenarios.md)")
    p.add_argument("--report", type=Path, help="write the JSON report here ('-': stdout)")
    p.add_argument(
        "--config",
        type=Path,
        help="aggregator configuration whose detector thresholds to use (default: built-in defaults)",
    )
    p.add_argument("--quiet", action="store_true", help="do not print the verdicts summary on stderr")
    p.add_argument(
        "--log-level",
        choices=LEVELS,
        default="warning",
        help="log level of the simulated hosts' agents and the engine (default: warning)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # every simulated host runs a real agent: at info level, a thousand hosts would each log their start
    setup_logging("sim", args.log_level)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"sentinel sim: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_aggregator_config(args.config) if args.config else None
    except ConfigError as exc:
        print(f"sentinel sim: {exc}", file=sys.stderr)
        return 2
    result = run_scenario(scenario, config)
    report = result.report()
    text = json.dumps(report, indent=2) + "\n"
    if args.report is not None:
        if str(args.report) == "-":
            sys.stdout.write(text)
        else:
            try:
                args.report.write_text(text)
            except OSError as exc:
                print(f"sentinel sim: {args.report}: cannot write: {exc.strerror or exc}", file=sys.stderr)
                return 2
    if not args.quiet:
        stats = report["stats"]
        print(
            f"{scenario.name}: {stats['gpus']} GPUs, {scenario.duration_s:g} simulated s in {stats['wall_s']:.1f} s, "
            f"{len(report['faults'])} fault(s), {len(report['verdicts'])} verdict(s)",
            file=sys.stderr,
        )
        for v in report["verdicts"]:
            where = v["host"] or "-"
            if v["gpu"] is not None:
                where += f"/gpu{v['gpu']}"
            if v["rank"] is not None:
                where += f" rank {v['rank']}"
            print(
                f"  t={v['t_s']:8.1f}s {v['kind']:<11} {where:<24} {v['reason']} -> {v['action']}",
                file=sys.stderr,
            )
    return 0

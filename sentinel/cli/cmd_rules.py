"""``sentinel rules build``: render the Prometheus alert and recording rules from their owners' declarations.

The alerts live beside the rules they page on (``sentinel/components/<name>/alerts.py``, the daemons'
``alerts.py``); the rendered file is checked in as ``rules/sentinel.rules.yml``. ``--check`` renders without
writing and fails when the checked-in file is not what the sources produce (CI runs it). With a daemon's
configuration file, thresholds that are settings (the IB flap threshold, the clock-rate tolerance) are that
file's, so a site that changes them gets alerts that agree with its verdicts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentinel.config import AgentConfig, AggregatorConfig, ConfigError, load_daemon_config
from sentinel.ops.rules import RULES_FILE, is_current, render
from sentinel.ops.settings import OpsSettings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "rules",
        help="build the Prometheus alert and recording rules from their owners' declarations",
        description=__doc__.replace("``", ""),
    )
    sub = parser.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)
    build = sub.add_parser(
        "build",
        help="write rules/sentinel.rules.yml (or check that it is current)",
        description="Render every alert and recording rule to OUT.",
    )
    build.add_argument(
        "--out",
        type=Path,
        default=RULES_FILE,
        help=f"the rule file (default: ./{RULES_FILE}, run from the repository root)",
    )
    build.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when OUT is missing or differs from what the sources render",
    )
    build.add_argument(
        "--agent-config", type=Path, help="take thresholds from this agent configuration (default: defaults)"
    )
    build.add_argument(
        "--aggregator-config",
        type=Path,
        help="take thresholds from this aggregator configuration (default: defaults)",
    )
    build.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> OpsSettings:
    # the environment's SENTINEL_* overrides are the daemons' business, not a build's: env={}
    agent = (
        load_daemon_config("agent", AgentConfig, args.agent_config, env={})
        if args.agent_config is not None
        else AgentConfig()
    )
    aggregator = (
        load_daemon_config("aggregator", AggregatorConfig, args.aggregator_config, env={})
        if args.aggregator_config is not None
        else AggregatorConfig()
    )
    return OpsSettings(agent=agent, aggregator=aggregator)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"sentinel rules: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not is_current(out, settings):
            print(
                f"sentinel rules: {out} is missing or out of date (run `sentinel rules build --out {out}`)",
                file=sys.stderr,
            )
            return 1
        print(f"{out} is current")
        return 0
    text = render(settings)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"sentinel rules: {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {text.count('- alert: ')} alerts and {text.count('- record: ')} recording rules to {out}")
    return 0

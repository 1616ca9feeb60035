"""``sentinel dashboards build``: render the Grafana dashboards from their grafanalib sources.

The sources live in ``sentinel/ops/dashboards/``; the JSON is checked in under ``dashboards/``. ``--check``
renders without writing and fails when the checked-in JSON is not what the sources produce (CI runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentinel.ops.dashboards import render_all, stale_files


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dashboards",
        help="build the Grafana dashboards from their grafanalib sources",
        description=__doc__.replace("``", ""),
    )
    sub = parser.add_subparsers(dest="dashboards_command", metavar="SUBCOMMAND", required=True)
    build = sub.add_parser(
        "build",
        help="write dashboards/<uid>.json for every dashboard (or check that they are current)",
        description="Render every dashboard to OUT/<uid>.json.",
    )
    build.add_argument(
        "--out",
        type=Path,
        default=Path("dashboards"),
        help="directory of the JSON files (default: ./dashboards, run from the repository root)",
    )
    build.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name the files that are missing, stale or without a source",
    )
    build.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    if args.check:
        if not out.is_dir():
            print(f"sentinel dashboards: {out}: not a directory", file=sys.stderr)
            return 2
        stale = stale_files(out)
        if stale:
            print(
                f"sentinel dashboards: out of date in {out}: {', '.join(stale)} "
                f"(run `sentinel dashboards build --out {out}`)",
                file=sys.stderr,
            )
            return 1
        print(f"dashboards in {out} are current")
        return 0
    try:
        out.mkdir(parents=True, exist_ok=True)
        rendered = render_all()
        for name, text in rendered.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"sentinel dashboards: {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(rendered)} dashboards to {out}")
    return 0

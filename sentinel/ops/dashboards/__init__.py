"""Grafana dashboards for sentinel, written with grafanalib; ``sentinel dashboards build`` renders them.

The generated JSON is checked in under ``dashboards/`` (one ``<uid>.json`` per dashboard); a test fails
when it differs from what these sources render, so the JSON is never edited by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder

from sentinel.ops.dashboards import fleet, goodput, gpu, health, job

#: uid → builder, in the order the README lists them.
DASHBOARDS: dict[str, Callable[[], Any]] = {
    fleet.UID: fleet.build,
    job.UID: job.build,
    gpu.UID: gpu.build,
    health.UID: health.build,
    goodput.UID: goodput.build,
}


def render(uid: str) -> str:
    """The dashboard's JSON text, deterministic (sorted keys) so the checked-in file diffs cleanly."""
    data = DASHBOARDS[uid]().to_json_data()
    text: str = json.dumps(data, cls=DashboardEncoder, sort_keys=True, indent=2)
    return text + "\n"


def render_all() -> dict[str, str]:
    """File name → JSON text for every dashboard."""
    return {f"{uid}.json": render(uid) for uid in DASHBOARDS}


def panel_queries(dashboard_json: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) for every query of every panel, rows included."""
    stack = list(dashboard_json.get("panels", []))
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            if expr:
                yield panel.get("title", ""), expr


def stale_files(out_dir: Path) -> list[str]:
    """Names of files under ``out_dir`` that differ from the sources, are missing, or have no source."""
    wanted = render_all()
    problems = [
        name
        for name, text in wanted.items()
        if not (out_dir / name).is_file() or (out_dir / name).read_text(encoding="utf-8") != text
    ]
    problems += sorted(p.name for p in out_dir.glob("*.json") if p.name not in wanted)
    return problems

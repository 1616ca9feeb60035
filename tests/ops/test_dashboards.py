"""The dashboards: the checked-in JSON is what the sources render, every panel query is valid PromQL on
sentinel's metrics, and every dashboard has the shared template variables."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sentinel.cli import main
from sentinel.ops.dashboards import DASHBOARDS, panel_queries, render_all, stale_files
from tests.ops.expressions import substitute
from tests.ops.rulefiles import recording_rules
from tests.support import REPO, need_binary

DASHBOARDS_DIR = REPO / "dashboards"
VARIABLES = {"datasource", "cluster", "job", "host", "gpu"}
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
MATCHERS = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
IDENTIFIER = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")
KEYWORDS = {"and", "or", "unless", "offset", "bool"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once label lists, matchers and calls are gone."""
    bare = MATCHERS.sub("", LABEL_LISTS.sub("", expr))
    return {name for name in IDENTIFIER.findall(bare) if name not in KEYWORDS}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS_DIR / name).read_text(encoding="utf-8"))
    return data


def all_queries() -> list[tuple[str, str, str]]:
    return [
        (uid, title, expr)
        for uid in DASHBOARDS
        for title, expr in panel_queries(json.loads(render_all()[f"{uid}.json"]))
    ]


def test_checked_in_json_is_current() -> None:
    assert stale_files(DASHBOARDS_DIR) == [], "run `sentinel dashboards build` and commit dashboards/"


def test_cli_check_passes_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "build", "--check", "--out", str(DASHBOARDS_DIR)]) == 0


def test_cli_build_then_check_and_detect_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["dashboards", "build", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{uid}.json" for uid in DASHBOARDS)
    assert main(["dashboards", "build", "--check", "--out", str(out)]) == 0
    edited = out / "sentinel-gpu.json"
    edited.write_text(edited.read_text().replace("GPU detail", "GPU details"))
    (out / "orphan.json").write_text("{}")
    capsys.readouterr()
    assert main(["dashboards", "build", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "sentinel-gpu.json" in err and "orphan.json" in err and err[-1] == "\n" and err.count("\n") == 1


def test_cli_check_on_missing_directory_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "build", "--check", "--out", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_dashboard_structure(uid: str) -> None:
    data = load(f"{uid}.json")
    assert data["uid"] == uid
    assert {v["name"] for v in data["templating"]["list"]} == VARIABLES
    ids = [panel["id"] for panel in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"


def test_queries_use_only_sentinel_metrics_and_recording_rules() -> None:
    recorded = {rule["record"] for rule in recording_rules()}
    for uid, title, expr in all_queries():
        names = metric_names(expr)
        assert names, f"{uid}/{title}: no metric in {expr}"
        for name in names:
            assert name.startswith("sentinel_") or name in recorded or name == "up", f"{uid}/{title}: {name}"


def test_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses every panel query (as a recording rule, the one way it checks bare expressions)."""
    promtool = need_binary("promtool")
    lines = ["groups:", "  - name: dashboard-queries", "    rules:"]
    for index, (_uid, _title, expr) in enumerate(all_queries()):
        lines += [f"      - record: dashboard_query_{index}", f"        expr: {json.dumps(substitute(expr))}"]
    rules = tmp_path / "queries.rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""The alerting rules: promtool accepts them, their unit tests pass, and every alert is complete.

"Complete" means: a severity, a summary, a description, a runbook that exists and says what the alert means,
how to confirm it and what to do, a ``for:``, and promtool unit tests that see it fire *and* stay quiet.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from tests.ops.rulefiles import (
    RULE_FILES,
    RULE_TEST_FILES,
    RUNBOOKS_DIR,
    alerting_rules,
    load_yaml,
)
from tests.support import REPO, need_binary

SEVERITIES = {"critical", "warning", "info"}
RUNBOOK_SECTIONS = ("## What it means", "## How to confirm", "## What to do")
DURATION = re.compile(r"^(\d+(ms|s|m|h|d))+$")


def test_rule_files_exist() -> None:
    assert RULE_FILES, "no rules/*.rules.yml"
    assert RULE_TEST_FILES, "no rules/tests/*.test.yml"


def test_promtool_check_rules() -> None:
    promtool = need_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True, timeout=60
    )
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests() -> None:
    promtool = need_binary("promtool")
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, RULE_TEST_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda rule: rule["alert"])
def test_alert_has_severity_annotations_runbook_and_for(rule: dict[str, object]) -> None:
    name = rule["alert"]
    labels = rule.get("labels") or {}
    annotations = rule.get("annotations") or {}
    assert isinstance(labels, dict) and isinstance(annotations, dict)
    assert labels.get("severity") in SEVERITIES, f"{name}: severity label"
    for key in ("summary", "description", "runbook_url"):
        assert str(annotations.get(key, "")).strip(), f"{name}: {key} annotation missing"
    assert annotations["runbook_url"] == f"docs/runbooks/{name}.md"
    runbook = RUNBOOKS_DIR / f"{name}.md"
    assert runbook.is_file(), f"{name}: {runbook} missing"
    text = runbook.read_text(encoding="utf-8")
    assert text.startswith(f"# {name}\n")
    for section in RUNBOOK_SECTIONS:
        assert section in text, f"{runbook.name}: section {section!r} missing"
    assert DURATION.match(str(rule.get("for", ""))), f"{name}: a `for:` duration is required"


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    firing: dict[str, int] = defaultdict(int)
    quiet: dict[str, int] = defaultdict(int)
    for path in RULE_TEST_FILES:
        for case in load_yaml(path)["tests"]:
            for check in case.get("alert_rule_test") or []:
                expected = check.get("exp_alerts") or []
                (firing if expected else quiet)[check["alertname"]] += 1
                for alert in expected:
                    # label *and* annotation values are pinned for every firing expectation
                    assert alert.get("exp_labels"), f"{path.name}: {check['alertname']} without exp_labels"
                    assert alert.get("exp_annotations"), (
                        f"{path.name}: {check['alertname']} without annotations"
                    )
    names = {rule["alert"] for rule in alerting_rules()}
    assert not (set(firing) | set(quiet)) - names, "tests name alerts that do not exist"
    assert sorted(n for n in names if not firing[n]) == [], "alerts never seen firing in a unit test"
    assert sorted(n for n in names if not quiet[n]) == [], "alerts never seen quiet in a unit test"


def test_runbook_index_lists_every_alert() -> None:
    index = (RUNBOOKS_DIR / "README.md").read_text(encoding="utf-8")
    for rule in alerting_rules():
        assert f"[{rule['alert']}.md]({rule['alert']}.md)" in index


def test_operations_doc_table_matches_the_rules() -> None:
    """docs/operations.md lists every alert with the severity and `for:` the rules really have."""
    rows = {}
    for line in (REPO / "docs" / "operations.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("Sentinel"):
            rows[cells[0]] = (cells[1], cells[2])
    expected = {rule["alert"]: (rule["labels"]["severity"], str(rule["for"])) for rule in alerting_rules()}
    assert rows == expected


def test_unit_tests_fail_when_alerts_never_fire(tmp_path: Path) -> None:
    """The firing expectations are real: with every alert's expression made impossible, promtool reports a
    failure for every alert."""
    promtool = need_binary("promtool")
    (tmp_path / "tests").mkdir()
    for path in RULE_TEST_FILES:
        shutil.copy(path, tmp_path / "tests" / path.name)
    for path in RULE_FILES:
        data = load_yaml(path)
        for group in data["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["expr"] = "vector(1) == 0"
        (tmp_path / path.name).write_text(yaml.safe_dump(data), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", *(str(tmp_path / "tests" / p.name) for p in RULE_TEST_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    failed = set(re.findall(r"alertname: (\w+)", result.stdout + result.stderr))
    assert failed == {rule["alert"] for rule in alerting_rules()}

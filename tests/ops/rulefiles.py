"""Reading the rule files and their promtool unit tests (shared by the rule and end-to-end tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO

RULES_DIR = REPO / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
RULE_TEST_FILES = sorted((RULES_DIR / "tests").glob("*.test.yml"))
RUNBOOKS_DIR = REPO / "docs" / "runbooks"


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def all_rules() -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of every rule file, in file order."""
    rules: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in load_yaml(path)["groups"]:
            rules.extend(group["rules"])
    return rules


def alerting_rules() -> list[dict[str, Any]]:
    return [rule for rule in all_rules() if "alert" in rule]


def recording_rules() -> list[dict[str, Any]]:
    return [rule for rule in all_rules() if "record" in rule]

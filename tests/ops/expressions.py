"""Every PromQL expression operators depend on — rule expressions and dashboard panel queries — keyed for
the end-to-end allowlist (tests/ops/e2e_may_be_empty.yml)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from sentinel.ops.dashboards import panel_queries, render_all
from tests.ops.rulefiles import all_rules

ALLOWLIST = Path(__file__).with_name("e2e_may_be_empty.yml")

#: What Grafana would substitute for the dashboards' variables ("All" and a rate window).
SUBSTITUTIONS = {"$__rate_interval": "1m", "$cluster": ".*", "$job": ".*", "$host": ".*", "$gpu": ".*"}


def substitute(expr: str) -> str:
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    return expr


def all_expressions() -> dict[str, str]:
    """Key → expression: ``rule <name>`` and ``dashboard <uid> / <panel title> / <query number>``."""
    expressions = {f"rule {rule.get('alert') or rule['record']}": str(rule["expr"]) for rule in all_rules()}
    for name, text in render_all().items():
        uid = name.removesuffix(".json")
        seen: dict[str, int] = {}
        for title, expr in panel_queries(json.loads(text)):
            seen[title] = seen.get(title, 0) + 1
            expressions[f"dashboard {uid} / {title} / {seen[title]}"] = substitute(expr)
    return expressions


LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$")


def variable_queries() -> dict[str, tuple[str, str]]:
    """``<uid> $<variable>`` → (label, series selector) of every label_values() template variable."""
    queries: dict[str, tuple[str, str]] = {}
    for name, text in render_all().items():
        for variable in json.loads(text)["templating"]["list"]:
            match = LABEL_VALUES.match(str(variable.get("query") or ""))
            if variable.get("type") == "query" and match:
                key = f"{name.removesuffix('.json')} ${variable['name']}"
                queries[key] = (match["label"], substitute(match["match"]))
    return queries


def may_be_empty() -> dict[str, str]:
    """The checked-in allowlist: key → why that expression may return nothing in the fault scenario."""
    data = yaml.safe_load(ALLOWLIST.read_text(encoding="utf-8")) or {}
    return {str(key): str(reason) for key, reason in data.items()}

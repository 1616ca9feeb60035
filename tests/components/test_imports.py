"""The components are the shared layer: nothing under ``sentinel/components`` imports the agent or the
aggregator (either daemon imports the components, never the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

import sentinel.components

FORBIDDEN = ("sentinel.agent", "sentinel.aggregator")
ROOT = Path(sentinel.components.__file__).resolve().parent


def daemon_imports(source: str, module: str) -> list[str]:
    """The modules of ``FORBIDDEN`` that ``source`` (the module ``module``) imports, at any depth of the
    file (function-level imports included; relative imports resolved)."""
    found: list[str] = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found += [n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
    return sorted(set(found))


def test_no_component_module_imports_the_agent_or_the_aggregator() -> None:
    offending: dict[str, list[str]] = {}
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 50  # the walk found the tree
    for path in files:
        rel = path.relative_to(ROOT.parent.parent).with_suffix("")
        module = ".".join(rel.parts)
        if path.name == "__init__.py":
            module += ".__init__"
        found = daemon_imports(path.read_text(), module)
        if found:
            offending[module] = found
    assert offending == {}


def test_the_check_sees_every_spelling_of_an_import() -> None:
    module = "sentinel.components.ib.collector"
    assert daemon_imports("from sentinel.agent.collectors.base import Collector\n", module) == [
        "sentinel.agent.collectors.base",
        "sentinel.agent.collectors.base.Collector",
    ]
    assert daemon_imports("def f():\n    import sentinel.aggregator.state\n", module) == [
        "sentinel.aggregator.state"
    ]
    assert daemon_imports("from sentinel import aggregator\n", module) == ["sentinel.aggregator"]
    assert daemon_imports("from ...agent import worker\n", module) == [
        "sentinel.agent",
        "sentinel.agent.worker",
    ]
    assert daemon_imports("importlib.import_module('sentinel.agent.sink')\n", module) == [
        "sentinel.agent.sink"
    ]
    assert (
        daemon_imports("from sentinel.components.ib import rule\nimport sentinel.agentless\n", module) == []
    )

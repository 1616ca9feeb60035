"""The configuration examples operators copy from the docs are valid for the real tools."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.ops.rulefiles import RULE_FILES
from tests.ops.stack import METRIC_RELABEL
from tests.support import REPO, need_binary

YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def yaml_blocks(doc: str) -> list[str]:
    return YAML_BLOCK.findall((REPO / "docs" / doc).read_text(encoding="utf-8"))


def test_alertmanager_example_passes_amtool(tmp_path: Path) -> None:
    amtool = need_binary("amtool")
    (block,) = [b for b in yaml_blocks("operations.md") if b.startswith("route:")]
    config = tmp_path / "alertmanager.yml"
    config.write_text(block, encoding="utf-8")
    result = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 inhibit rules" in result.stdout


def test_prometheus_example_passes_promtool(tmp_path: Path) -> None:
    """The scrape configuration of docs/deploy.md, with its rule file pointed at this repository's."""
    promtool = need_binary("promtool")
    (block,) = [b for b in yaml_blocks("deploy.md") if "scrape_configs:" in b]
    assert "/etc/prometheus/rules/sentinel.rules.yml" in block
    config = tmp_path / "prometheus.yml"
    config.write_text(block.replace("/etc/prometheus/rules/sentinel.rules.yml", str(RULE_FILES[0])))
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_prometheus_example_uses_the_e2e_relabelling() -> None:
    """The relabelling the end-to-end test proves is the one the docs prescribe."""
    (block,) = [b for b in yaml_blocks("deploy.md") if "scrape_configs:" in b]
    config = yaml.safe_load(block)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"sentinel-agent", "sentinel-aggregator"}
    for job in jobs.values():
        assert job["metric_relabel_configs"] == METRIC_RELABEL

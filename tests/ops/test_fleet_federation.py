"""The global Prometheus example of docs/deploy.md passes promtool and only federates recorded series."""

from __future__ import annotations

import subprocess

import yaml

from tests.ops.rulefiles import RULE_FILES
from tests.support import REPO, need_binary

EXAMPLE = REPO / "examples" / "prometheus" / "global-federation.yml"


def test_global_federation_config_passes_promtool() -> None:
    promtool = need_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(EXAMPLE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_federation_matches_every_fleet_recording_rule_and_no_raw_series() -> None:
    import re

    (match_all, _alerts) = yaml.safe_load(EXAMPLE.read_text())["scrape_configs"][0]["params"]["match[]"]
    pattern = re.compile(match_all.split('"')[1])
    recorded = [
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        if group["name"] == "sentinel-fleet"
        for rule in group["rules"]
    ]
    assert recorded and all(pattern.fullmatch(name) for name in recorded)
    assert not pattern.fullmatch("sentinel_verdict_open") and not pattern.fullmatch(
        "sentinel_gpu_temperature_celsius"
    )

"""One fact, one threshold: the verdict rule, the alert and the dashboard panel act at the same value, and
follow the setting when it changes (the IB flap threshold), and alerts carry the severity and action their
component's rule decides (row remap, ECC, device, Xid) — which the log classifier reports too."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from sentinel.components.alerting import AlertRule
from sentinel.components.device.record import GpuState
from sentinel.components.device.rule import evaluate_state
from sentinel.components.ecc.record import EccCounters
from sentinel.components.ecc.rule import evaluate_ecc
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.rule import PortRuleConfig, evaluate_ports
from sentinel.components.rowremap.record import RowRemap
from sentinel.components.rowremap.rule import evaluate_row_remap
from sentinel.components.xid.catalog import xid_info
from sentinel.config.aggregator import AggregatorConfig, DetectConfig
from sentinel.ops.dashboards import fleet
from sentinel.ops.rules import alert_rules
from sentinel.ops.settings import OpsSettings
from sentinel.signals import classify_text
from tests.support import need_binary

FLAP = "SentinelIbLinkFlapping"


def with_flap_downs(flap_downs: int) -> OpsSettings:
    network = PortRuleConfig(flap_downs=flap_downs)
    return OpsSettings(aggregator=AggregatorConfig(detect=DetectConfig(network=network)))


def port_with_downs(downs: int) -> IbPort:
    return IbPort(
        device="mlx5_0",
        port=1,
        state="active",
        phys_state="LinkUp",
        rate_gbps=400.0,
        link_layer="InfiniBand",
        downs=[float(i) for i in range(downs)],
        flap_window_s=600.0,
        seen_up=True,
        t=float(downs),
    )


def verdict_threshold(cfg: PortRuleConfig) -> int:
    """The fewest losses of link at which the port rule calls a flap."""
    for downs in range(1, 65):
        if any(
            f.reason == "ib_link_flap" for f in evaluate_ports([port_with_downs(downs)], cfg, float(downs))
        ):
            return downs
    raise AssertionError("the rule never calls a flap")


def panel_threshold(panel_json: dict[str, Any]) -> float:
    """The value at which the panel turns red."""
    steps = panel_json["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return float(next(step["value"] for step in steps if step["color"] == "red"))


def alert_fires_from(rule: AlertRule, threshold: int, tmp_path: Path) -> tuple[bool, str]:
    """Whether promtool sees the alert fire for exactly the ports with ``threshold`` or more losses of link
    (one series per count from 1 to threshold + 2)."""
    promtool = need_binary("promtool")
    bare = {"alert": rule.alert, "expr": rule.expr, "for": "1m", "labels": rule.labels}
    (tmp_path / "rule.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [bare]}]}))
    counts = range(1, threshold + 3)
    labels = {"cluster": "c", "host": "h", "device": "mlx5_0"}
    series = [
        {
            "series": "sentinel_ib_port_link_downs_in_window"
            + "{"
            + ",".join(f'{k}="{v}"' for k, v in {**labels, "port": str(n)}.items())
            + "}",
            "values": f"{n}x10",
        }
        for n in counts
    ]
    expected = [{"exp_labels": {**labels, "port": str(n), **rule.labels}} for n in counts if n >= threshold]
    test = {
        "rule_files": ["rule.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "5m", "alertname": rule.alert, "exp_alerts": expected}],
            }
        ],
    }
    (tmp_path / "rule.test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [promtool, "test", "rules", "rule.test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    return result.returncode == 0, result.stdout + result.stderr


def flap_disagreements(
    verdict: OpsSettings, alert: OpsSettings, panel: OpsSettings, tmp_path: Path
) -> list[str]:
    """Which of the alert and the panel do not act where the verdict rule does."""
    threshold = verdict_threshold(verdict.aggregator.detect.network)
    rule = next(r for r in alert_rules(alert) if r.alert == FLAP)
    problems = []
    agrees, output = alert_fires_from(rule, threshold, tmp_path)
    if not agrees:
        problems.append(f"alert {FLAP} does not fire from {threshold} losses of link: {output}")
    drawn = panel_threshold(fleet.flaps_panel(panel).to_json_data())
    if drawn != threshold:
        problems.append(f"the flaps panel turns red at {drawn:g}, the verdict at {threshold}")
    return problems


@pytest.mark.parametrize("flap_downs", [PortRuleConfig().flap_downs, 1, 5])
def test_flap_verdict_alert_and_panel_agree_and_follow_the_setting(flap_downs: int, tmp_path: Path) -> None:
    settings = with_flap_downs(flap_downs)
    assert verdict_threshold(settings.aggregator.detect.network) == flap_downs
    assert flap_disagreements(settings, settings, settings, tmp_path) == []
    panel = fleet.flaps_panel(settings).to_json_data()
    assert panel["description"].startswith(f"{flap_downs} or more is a flap")


def test_a_disagreement_is_detected(tmp_path: Path) -> None:
    """The check can fail: an alert or a panel built from another setting than the verdict's is named."""
    default, five = OpsSettings(), with_flap_downs(5)
    (tmp_path / "alert").mkdir()
    (tmp_path / "panel").mkdir()
    alert_off = flap_disagreements(default, five, default, tmp_path / "alert")
    assert len(alert_off) == 1 and alert_off[0].startswith(f"alert {FLAP}")
    panel_off = flap_disagreements(default, default, five, tmp_path / "panel")
    assert panel_off == ["the flaps panel turns red at 5, the verdict at 3"]


def test_the_fleet_dashboard_carries_the_flap_panel() -> None:
    data = fleet.build(with_flap_downs(7)).to_json_data()
    titles = {panel.title: panel for panel in data["panels"]}
    assert panel_threshold(titles["Losses of link (flaps) in the agents' window"].to_json_data()) == 7


def test_clock_skew_alert_follows_the_straggler_tolerance() -> None:
    config = AggregatorConfig()
    tolerance = config.detect.straggler.max_clock_rate_error
    wider = msgspec.structs.replace(
        config,
        detect=msgspec.structs.replace(
            config.detect,
            straggler=msgspec.structs.replace(config.detect.straggler, max_clock_rate_error=0.05),
        ),
    )
    for aggregator, rate in ((config, tolerance), (wider, 0.05)):
        rule = next(
            r for r in alert_rules(OpsSettings(aggregator=aggregator)) if r.alert == "SentinelHostClockSkew"
        )
        assert f"(abs(sentinel_host_clock_rate - 1)) > {rate:g}" in rule.expr
        assert f"by more than {rate * 100:g}%" in rule.description


def alert(name: str) -> AlertRule:
    return next(r for r in alert_rules() if r.alert == name)


def test_row_remap_alerts_say_what_the_rule_and_the_log_classifier_say() -> None:
    failed = evaluate_row_remap(RowRemap(failure=True))
    pending = evaluate_row_remap(RowRemap(correctable=1, pending=True))
    line = classify_text("Remapping Failure Occurred : Yes")
    assert alert("SentinelGpuRowRemapFailed").labels == {"severity": failed.severity, "action": failed.action}
    assert (line.severity, line.action) == (failed.severity, failed.action) == ("critical", "rma")
    assert alert("SentinelGpuRowRemapPending").labels == {
        "severity": pending.severity,
        "action": pending.action,
    }


def test_ecc_alert_severity_is_the_rules_and_the_log_classifiers() -> None:
    finding = evaluate_ecc(EccCounters(volatile_uncorrected=1))
    line = classify_text("NVRM: GPU at PCI:0000:3b:00: uncorrectable ECC error detected")
    assert alert("SentinelGpuUncorrectableEcc").severity == finding.severity == line.severity == "critical"
    assert line.action == finding.action


def test_device_alerts_have_the_rules_severity() -> None:
    states: tuple[tuple[str, GpuState], ...] = (
        ("SentinelGpuLost", "lost"),
        ("SentinelGpuUnresponsive", "unresponsive"),
    )
    for name, state in states:
        finding = evaluate_state(state)
        assert finding is not None and alert(name).severity == finding.severity
    lost = evaluate_state("lost")
    assert lost is not None and alert("SentinelGpuLost").action == lost.action


def test_critical_xid_alert_matches_the_catalogs_severity_label() -> None:
    rule = alert("SentinelGpuCriticalXid")
    assert rule.severity == "critical" and '{severity="critical"}' in rule.expr
    assert xid_info(79).severity == "critical"  # fallen off the bus: the catalog pages on it

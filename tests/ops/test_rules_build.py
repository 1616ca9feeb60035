"""The rule file is built from the alerts' owners: the checked-in file is what they render, the renderer
writes YAML that reads back as exactly the declared rules, and every alert's runbook exists."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sentinel.aggregator import alerts as aggregator_alerts
from sentinel.cli import main
from sentinel.components.alerting import GROUPS, AlertRule, RecordingRule, duration, scalar, spoken
from sentinel.config.aggregator import AggregatorConfig
from sentinel.ops.rules import RULES_FILE, alert_rules, all_rules, is_current, missing_runbooks, render
from sentinel.ops.settings import OpsSettings
from tests.ops.rulefiles import load_yaml
from tests.support import REPO

CHECKED_IN = REPO / RULES_FILE

#: every alert Alertmanager routes and runbooks name: generating the file must not lose or rename one
ROUTED_ALERTS = {
    "SentinelGpuFaulty", "SentinelGpuDegraded", "SentinelGpuRowRemapPending", "SentinelGpuRowRemapFailed",
    "SentinelGpuUncorrectableEcc", "SentinelGpuCriticalXid", "SentinelGpuLost", "SentinelGpuUnresponsive",
    "SentinelIbPortDown", "SentinelIbLinkFlapping", "SentinelIbPortDegraded", "SentinelIbReadErrors",
    "SentinelLinkSlow", "SentinelNetdevReadErrors",
    "SentinelNcclRasQueryFailing", "SentinelJobStalled", "SentinelStraggler", "SentinelHostSilent",
    "SentinelDetectorFailing", "SentinelConfigReloadFailed", "SentinelAgentDown", "SentinelAgentStale",
    "SentinelAgentCollectorFailing", "SentinelAgentDisconnected", "SentinelAgentStreamRefused",
    "SentinelAgentDataDropped", "SentinelAgentEvidenceIncomplete", "SentinelAggregatorDown", "SentinelIngestLag", "SentinelIngestRefusing",
    "SentinelHostClockSkew", "SentinelStateStoreFailing", "SentinelStateSnapshotTooLarge",
    "SentinelSpoolGrowing", "SentinelAgentSpoolFailing", "SentinelRemediationBreakerOpen",
    "SentinelRemediationFailing", "SentinelNodeDrained", "SentinelNcclRasListenerUntrusted",
    "SentinelRemediationLeaseInvalid", "SentinelRemediationNodeHeldDown",
    "SentinelRequeueBreakerOpen", "SentinelIncidentDrainSlow", "SentinelIncidentNotResumed",
    "SentinelNvlinkDomainDown", "SentinelNvlinkDomainIncomplete",
    "SentinelFabricManagerDown", "SentinelNvSwitchFatal", "SentinelNvSwitchErrorsRepeating",
    "SentinelFabricNotCompleted",
    "SentinelIbHcaFailed",
}  # fmt: skip


def test_checked_in_rules_are_current() -> None:
    assert is_current(CHECKED_IN), "run `sentinel rules build` and commit rules/sentinel.rules.yml"


def test_render_is_reproducible() -> None:
    assert render() == render() == render(OpsSettings())


def test_no_routed_alert_lost_or_renamed() -> None:
    assert {rule.alert for rule in alert_rules()} == ROUTED_ALERTS


def test_rendered_yaml_is_the_declared_rules() -> None:
    """Whatever style the renderer picks for a string, YAML reads back exactly the declared value."""
    loaded = [rule for group in yaml.safe_load(render())["groups"] for rule in group["rules"]]
    declared = sorted(all_rules(), key=lambda rule: GROUPS.index(rule.group))  # the file groups them
    assert len(loaded) == len(declared)
    for got, want in zip(loaded, declared, strict=True):
        if isinstance(want, RecordingRule):
            assert got == {"record": want.record, "expr": want.expr}
        else:
            assert got == {
                "alert": want.alert,
                "expr": want.expr,
                "for": duration(want.for_s),
                "labels": want.labels,
                "annotations": want.annotations,
            }


def test_groups_come_in_file_order() -> None:
    names = [group["name"] for group in load_yaml(CHECKED_IN)["groups"]]
    rendered = {rule.group for rule in all_rules()}
    assert names == [name for name in names if name in rendered] and len(names) == len(rendered)


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=300))
def test_any_string_reads_back_exactly(text: str) -> None:
    assert yaml.safe_load("\n".join(["item:", *scalar("value", text, 2)]))["item"]["value"] == text


@given(
    st.lists(
        st.sampled_from(
            [
                "{{ $labels.host }}",
                "a:",
                "b: c",
                "#x",
                "- y",
                "true",
                "3",
                "é",
                "x  y",
                "'q'",
                "1:30",
                "2001-12-14",
                "=",
                "<<",
                "0b11",
                "1_0",
                "~",
                "NULL",
                ".Inf",
                "Off",
                "\\",
                '"',
                "%",
                "&a",
                "*a",
            ]
        ),
        max_size=40,
    ).map(" ".join)
)
def test_template_like_strings_read_back_exactly(text: str) -> None:
    assert yaml.safe_load("\n".join(["item:", *scalar("value", text, 2)]))["item"]["value"] == text


@pytest.mark.parametrize(
    ("seconds", "prom", "words"),
    [(0, "0s", "0 seconds"), (30, "30s", "30 seconds"), (60, "1m", "1 minute"), (600, "10m", "10 minutes"),
     (3600, "1h", "1 hour"), (5400, "90m", "90 minutes"), (61, "61s", "61 seconds")],
)  # fmt: skip
def test_durations(seconds: int, prom: str, words: str) -> None:
    assert (duration(seconds), spoken(seconds)) == (prom, words)


def test_every_runbook_link_points_to_an_existing_runbook() -> None:
    rules = alert_rules()
    assert all(rule.runbook_url == f"docs/runbooks/{rule.alert}.md" for rule in rules)
    assert missing_runbooks(rules, REPO) == []


def test_a_missing_runbook_is_named(tmp_path: Path) -> None:
    rule = next(r for r in alert_rules() if r.alert == "SentinelIbLinkFlapping")
    renamed = msgspec.structs.replace(rule, alert="SentinelIbLinkFlappingTwice")
    assert missing_runbooks([rule, renamed], REPO) == ["SentinelIbLinkFlappingTwice"]
    (tmp_path / "docs" / "runbooks").mkdir(parents=True)
    (tmp_path / "docs" / "runbooks" / "SentinelIbLinkFlapping.md").write_text("# Another title\n")
    assert missing_runbooks([rule], tmp_path) == ["SentinelIbLinkFlapping"]


def test_alert_names_are_validated() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"alert": "gpu down", "group": "sentinel-gpu", "expr": "up == 0", "for_s": 0,
                         "severity": "critical", "summary": "s", "description": "d"}, AlertRule)  # fmt: skip


def test_cli_check_passes_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "build", "--check", "--out", str(CHECKED_IN)]) == 0


def test_cli_build_then_check_and_detect_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rules" / "sentinel.rules.yml"
    assert main(["rules", "build", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == CHECKED_IN.read_text(encoding="utf-8")
    assert main(["rules", "build", "--check", "--out", str(out)]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace(">= 3", ">= 4"), encoding="utf-8")
    capsys.readouterr()
    assert main(["rules", "build", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert str(out) in err and err.count("\n") == 1


def test_cli_builds_for_a_sites_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "aggregator.toml"
    config.write_text("[detect.network]\nflap_downs = 5\n", encoding="utf-8")
    out = tmp_path / "site.rules.yml"
    assert main(["rules", "build", "--aggregator-config", str(config), "--out", str(out)]) == 0
    flapping = next(
        r for g in load_yaml(out)["groups"] for r in g["rules"] if r.get("alert") == "SentinelIbLinkFlapping"
    )
    assert flapping["expr"].endswith(">= 5")
    assert main(["rules", "build", "--check", "--aggregator-config", str(config), "--out", str(out)]) == 0
    assert main(["rules", "build", "--check", "--out", str(out)]) == 1


def test_cli_bad_configuration_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "aggregator.toml"
    config.write_text("[detect.network]\nflap_downs = 0\n", encoding="utf-8")
    assert main(["rules", "build", "--aggregator-config", str(config), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "flap_downs" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def gpu_alert_excludes(rules: list[AlertRule]) -> str:
    """The regex of reasons the GPU faulty alert leaves out, as rendered."""
    (faulty,) = [r for r in rules if r.alert == "SentinelGpuFaulty"]
    return faulty.expr.split('reason!~"', 1)[1].split('"', 1)[0]


def test_the_gpu_alerts_leave_out_exactly_the_reasons_other_alerts_take() -> None:
    """Port, link, switch, fabric-manager and domain verdicts page through their own alerts only."""
    excluded = re.compile(gpu_alert_excludes(alert_rules()))
    taken = [
        "ib_port_down",
        "ib_hca_dead",
        "link_slow",
        "sxid_24007",
        "fabric_manager_down",
        "fabric_not_completed",
        "fabric_domain_down",
        "fabric_domain_incomplete",
    ]
    assert [r for r in taken if not excluded.fullmatch(r)] == []
    gpu = [
        "xid_79",
        "xid_95_recurring",
        "gpu_lost",
        "row_remap_failure",
        "ecc_uncorrectable",
        "fabric_unregistered",
    ]
    assert [r for r in gpu if excluded.fullmatch(r)] == []


def test_a_new_alert_that_takes_reasons_removes_them_from_the_gpu_alerts() -> None:
    mine = AlertRule(
        alert="SentinelPsuFailed",
        group="sentinel-gpu",
        expr="vector(1)",
        for_s=0,
        severity="critical",
        summary="s",
        description="d",
        takes_reasons="psu_.*",
    )
    before = gpu_alert_excludes(aggregator_alerts.alerts(AggregatorConfig()))
    after = gpu_alert_excludes(aggregator_alerts.alerts(AggregatorConfig(), [mine]))
    assert "psu_" not in before and after.split("|") == sorted([*before.split("|"), "psu_.*"])

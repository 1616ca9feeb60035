"""End to end with the real stack: the aggregator daemon and real agents on a simulated cluster in real
time, scraped by a real Prometheus that evaluates sentinel's rules (a copy with `for:` scaled down) and
sends to a real Alertmanager, which delivers to a webhook receiver run by the test.

Proves: (a) Prometheus scrapes every agent and the aggregator; (b) every rule expression and every dashboard
query returns data, or is listed in e2e_may_be_empty.yml with the reason; (c) the right alerts reach
Alertmanager and the webhook, naming the culprit; (d) a healthy cluster fires nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.ops.expressions import all_expressions, may_be_empty, variable_queries
from tests.ops.rulefiles import RULE_FILES
from tests.ops.simstack import aggregator_process, need_real_stack, ports, simulated_agents, write_token
from tests.ops.stack import Stack, alertmanager_binary, eventually, free_port
from tests.support import need, need_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HOSTS = 5
SCENARIO_HEAD = f"""
seed = 11
duration_s = 600
tick_s = 1.0

[cluster]
hosts = {HOSTS}
gpus_per_host = 2

[[jobs]]
id = "train-a"
hosts = ["host-000", "host-001"]

[[jobs]]
id = "train-b"
hosts = ["host-002", "host-003"]
"""
# host-004 runs no job.
FAULTS = """
[[faults]]
at_s = 6.0
host = "host-001"
gpu = 1
kind = "xid"
xid = 79

[[faults]]
at_s = 6.0
host = "host-003"
gpu = 0
kind = "hang"

[[faults]]
at_s = 6.0
host = "host-004"
gpu = 1
kind = "row_remap_pending"

[[faults]]
at_s = 6.0
host = "host-004"
gpu = 0
kind = "nvlink_errors"
rate_per_s = 50.0
"""
FAULTED_HOSTS = {"host-001", "host-003", "host-004"}


def _tools() -> tuple[str, str]:
    prometheus = need_binary("prometheus")
    alertmanager = alertmanager_binary()
    need(alertmanager is not None, "alertmanager (Debian: prometheus-alertmanager) not installed")
    assert alertmanager is not None
    need_real_stack()
    return prometheus, alertmanager


class _Run:
    """Aggregator + agents + Prometheus/Alertmanager/webhook for one scenario."""

    def __init__(self, tmp_path: Path, scenario: str) -> None:
        self.tmp_path = tmp_path
        self.scenario = scenario

    async def __aenter__(self) -> Stack:
        prometheus, alertmanager = _tools()
        tokens = write_token(self.tmp_path)
        aggregator_port = free_port()
        agent_ports = ports(HOSTS)
        self._aggregator = aggregator_process(self.tmp_path / "aggregator", tokens, aggregator_port)
        aggregator = await self._aggregator.__aenter__()
        self._agents = simulated_agents(
            self.scenario,
            aggregator_port=aggregator_port,
            token_file=tokens,
            state_dir=self.tmp_path / "agents",
            metrics_ports=agent_ports,
        )
        self._stack: Stack | None = None
        try:
            agents = await self._agents.__aenter__()
            (self.tmp_path / "prom").mkdir()
            self._stack = Stack(
                self.tmp_path / "prom",
                prometheus=prometheus,
                alertmanager=alertmanager,
                agent_targets=agents.targets,
                aggregator_targets=[aggregator.target],
                rule_files=RULE_FILES,
            )
            self.aggregator = aggregator
            return await self._stack.__aenter__()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            await self._stack.__aexit__(None, None, None)
        await self._agents.__aexit__(None, None, None)
        await self._aggregator.__aexit__(None, None, None)

    def logs(self) -> str:
        stack_logs = self._stack.logs() if self._stack is not None else ""
        return f"{stack_logs}\n--- aggregator ---\n{self.aggregator.log_tail()}"


async def _all_targets_up(stack: Stack) -> bool:
    health = await stack.targets_up()
    return health.get("sentinel-agent") == ["up"] * HOSTS and health.get("sentinel-aggregator") == ["up"]


def _webhook_alert(stack: Stack, name: str, **labels: str) -> list[dict[str, Any]]:
    """Distinct firing alerts (by fingerprint; Alertmanager may notify a group again) matching the labels."""
    matching = {
        alert["fingerprint"]: alert
        for alert in stack.webhook.alerts()
        if alert["labels"].get("alertname") == name
        and all(alert["labels"].get(key) == value for key, value in labels.items())
    }
    return list(matching.values())


async def test_fault_scenario_alerts_reach_the_webhook_with_the_culprit(tmp_path: Path) -> None:
    run = _Run(tmp_path, SCENARIO_HEAD + FAULTS)
    async with run as stack:
        try:
            # (a) every agent and the aggregator are scraped
            await eventually(lambda: _all_targets_up(stack), timeout=20, what="all targets up")
            up = await stack.query('up{job=~"sentinel-agent|sentinel-aggregator"} == 1')
            assert len(up) == HOSTS + 1

            # (c) the faulty GPU and the stalled job's culprit arrive at the webhook
            async def faulty() -> list[dict[str, Any]]:
                return _webhook_alert(stack, "SentinelGpuFaulty", host="host-001", gpu="1")

            (gpu_alert,) = await eventually(
                faulty, timeout=45, what="SentinelGpuFaulty host-001/1 at the webhook"
            )
            assert gpu_alert["labels"]["job"] == "train-a"
            assert gpu_alert["labels"]["rank"] == "3"
            assert "79" in gpu_alert["labels"]["reason"]
            assert gpu_alert["labels"]["severity"] == "critical"
            assert gpu_alert["annotations"]["runbook_url"] == "docs/runbooks/SentinelGpuFaulty.md"

            async def stalled() -> list[dict[str, Any]]:
                return _webhook_alert(stack, "SentinelJobStalled", job="train-b")

            stalled_alerts = await eventually(
                stalled, timeout=45, what="SentinelJobStalled train-b at the webhook"
            )
            culprits = {
                (a["labels"].get("host"), a["labels"].get("gpu"), a["labels"].get("rank"))
                for a in stalled_alerts
            }
            assert ("host-003", "0", "2") in culprits, stalled_alerts
            assert "rank 2 on host-003/GPU 0" in " ".join(a["annotations"]["summary"] for a in stalled_alerts)

            async def remap() -> list[dict[str, Any]]:
                return _webhook_alert(stack, "SentinelGpuRowRemapPending", host="host-004", gpu="1")

            (remap_alert,) = await eventually(remap, timeout=30, what="SentinelGpuRowRemapPending host-004/1")
            assert remap_alert["labels"]["action"] == "reset_gpu"

            # Alertmanager holds them too (what its UI and amtool show)
            names = {a["labels"]["alertname"] for a in await stack.alertmanager_alerts()}
            assert {"SentinelGpuFaulty", "SentinelJobStalled", "SentinelGpuRowRemapPending"} <= names

            # no alert names a host without a fault
            for alert in stack.webhook.alerts():
                host = alert["labels"].get("host")
                assert host is None or host in FAULTED_HOSTS, alert["labels"]

            # the dashboards' template variables list the cluster, its jobs, hosts and GPUs
            for key, (label, match) in variable_queries().items():
                values = await stack.label_values(label, match)
                expected = {"cluster": ["e2e"], "job": ["train-a", "train-b"], "gpu": ["0", "1"]}
                expected["host"] = [f"host-{i:03d}" for i in range(HOSTS)]
                assert sorted(values) == expected[label], key

            # (b) every rule expression and dashboard query returns data, or may be empty for a stated reason
            expressions = all_expressions()
            allowed = may_be_empty()
            assert sorted(set(allowed) - set(expressions)) == [], "stale entries in e2e_may_be_empty.yml"
            results = await asyncio.gather(*(stack.query(expr) for expr in expressions.values()))
            empty = sorted(key for key, result in zip(expressions, results, strict=True) if not result)
            unexpected = [key for key in empty if key not in allowed]
            with_data = sorted(set(allowed) - set(empty))
            print("allowlisted but returned data this run:", *with_data, sep="\n  ")
            assert unexpected == [], "empty without a reason in e2e_may_be_empty.yml:\n" + "\n".join(
                unexpected
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{run.logs()}") from None


async def test_healthy_scenario_fires_nothing(tmp_path: Path) -> None:
    run = _Run(tmp_path, SCENARIO_HEAD)
    async with run as stack:
        try:
            await eventually(lambda: _all_targets_up(stack), timeout=20, what="all targets up")
            # Long enough for every scaled `for:` up to 20 s to elapse on a steady state.
            longest = max(s for s in stack.test_for_s.values() if s <= 20)
            await eventually(
                lambda: stack.query(f"count(count_over_time(sentinel_agents_connected[5m]) > {longest + 2})"),
                timeout=longest + 15,
                what="a healthy run longer than the alerts' `for:`",
            )
            assert await stack.query("sentinel_agents_connected == 5"), "agents not connected"
            assert await stack.query('count_over_time(ALERTS{alertstate="firing"}[10m])') == []
            assert stack.webhook.notifications == []
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{run.logs()}") from None

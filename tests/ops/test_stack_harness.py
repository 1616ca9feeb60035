"""The end-to-end harness against a stand-in exporter: Prometheus scrapes with the documented relabelling,
a rule fires, Alertmanager delivers it to the webhook, and it resolves. Proves the harness (and the scrape
contract) independently of the agent and aggregator."""

from __future__ import annotations

from pathlib import Path

from tests.ops.rulefiles import RULE_FILES
from tests.ops.stack import Stack, alertmanager_binary, eventually, metrics_server
from tests.support import need, need_binary

GPU = 'cluster="c1",host="host-001",uuid="GPU-1-{gpu}",pci_bus="0000:{bus}:00"'


class FakeExporters:
    """What an agent and the aggregator would export, with a switch for a faulty-GPU verdict."""

    def __init__(self) -> None:
        self.faulty = False

    def agent(self) -> str:
        return "\n".join(
            [
                'sentinel_agent_connected{cluster="c1",host="host-001"} 1',
                "sentinel_gpu_up{" + GPU.format(gpu=3, bus="3b") + ',gpu="3",job="train-a",rank="3"} 1',
                "sentinel_gpu_up{" + GPU.format(gpu=4, bus="5e") + ',gpu="4",job="",rank=""} 1',
                "",
            ]
        )

    def aggregator(self) -> str:
        lines = ['sentinel_agents_connected{cluster="c1"} 1']
        if self.faulty:
            lines.append(
                'sentinel_verdict_open{cluster="c1",kind="faulty",reason="xid_79",action="reboot",'
                'host="host-001",gpu="3",job="train-a",rank="3"} 1'
            )
        return "\n".join([*lines, ""])


async def test_harness_scrapes_fires_delivers_and_resolves(tmp_path: Path) -> None:
    prometheus = need_binary("prometheus")
    alertmanager = alertmanager_binary()
    need(alertmanager is not None, "alertmanager (Debian: prometheus-alertmanager) not installed")
    assert alertmanager is not None
    fake = FakeExporters()
    async with (
        metrics_server(fake.agent) as agent,
        metrics_server(fake.aggregator) as aggregator,
        Stack(
            tmp_path,
            prometheus=prometheus,
            alertmanager=alertmanager,
            agent_targets=[agent],
            aggregator_targets=[aggregator],
            rule_files=RULE_FILES,
        ) as stack,
    ):
        try:

            async def both_up() -> bool:
                health = await stack.targets_up()
                return health.get("sentinel-agent") == ["up"] and health.get("sentinel-aggregator") == ["up"]

            await eventually(both_up, timeout=20, what="both targets up")
            assert await stack.query('up{job="sentinel-agent"} == 1')

            # the training-job label survives as `job`; an empty one is absent; `up` keeps the scrape job
            (gpu3,) = await eventually(lambda: stack.query('sentinel_gpu_up{gpu="3"}'), timeout=10)
            assert gpu3["metric"]["job"] == "train-a" and "exported_job" not in gpu3["metric"]
            (gpu4,) = await stack.query('sentinel_gpu_up{gpu="4"}')
            assert "job" not in gpu4["metric"]

            # healthy: rules are evaluated (several cycles) and nothing is pending or firing
            async def rules_evaluated() -> bool:
                groups = await stack.rule_groups()
                return bool(groups) and not any(g["lastEvaluation"].startswith("0001") for g in groups)

            await eventually(rules_evaluated, timeout=10, what="rules evaluated")
            await eventually(
                lambda: stack.query("count(count_over_time(sentinel_agents_connected[1m]) >= 3)"),
                timeout=10,
            )
            assert await stack.firing() == []

            fake.faulty = True

            async def delivered() -> list[dict[str, object]]:
                return [a for a in stack.webhook.alerts() if a["labels"]["alertname"] == "SentinelGpuFaulty"]

            (alert,) = await eventually(delivered, timeout=30, what="SentinelGpuFaulty at the webhook")
            labels = alert["labels"]
            assert isinstance(labels, dict)
            assert {k: labels[k] for k in ("host", "gpu", "job", "rank", "reason", "action", "severity")} == {
                "host": "host-001",
                "gpu": "3",
                "job": "train-a",
                "rank": "3",
                "reason": "xid_79",
                "action": "reboot",
                "severity": "critical",
            }
            annotations = alert["annotations"]
            assert isinstance(annotations, dict)
            assert annotations["runbook_url"] == "docs/runbooks/SentinelGpuFaulty.md"
            assert "host-001/3" in annotations["summary"]

            fake.faulty = False
            await eventually(
                lambda: _resolved(stack, "SentinelGpuFaulty"), timeout=30, what="resolved notification"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stack.logs()}") from None


async def _resolved(stack: Stack, name: str) -> bool:
    return any(a["labels"]["alertname"] == name for a in stack.webhook.alerts("resolved"))

"""Two aggregators of one cluster, each scraped by its own Prometheus, both Prometheus sending to two
Alertmanagers clustered over gossip on 127.0.0.1: one faulty GPU is one notification.

The aggregators reach the same verdict independently (one agent streams to both); the alert's labels come
from the verdict (``max by (cluster, host, gpu, ...)``: the scrape ``instance`` is aggregated away), so the
four copies Alertmanager receives are one alert, and the clustered Alertmanagers' notification log makes
exactly one of them notify.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Event
from tests.aggregator.helpers import agent, batch, kernel_xid, running_aggregator
from tests.ops.rulefiles import RULE_FILES
from tests.ops.stack import (
    Alertmanager,
    Prometheus,
    WebhookReceiver,
    alertmanager_binary,
    eventually,
    fast_rules,
    free_port,
)
from tests.support import need, need_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: how long an Alertmanager waits per position in the cluster before it notifies itself (production: 15 s)
PEER_TIMEOUT_S = 2


class ClusteredAlertmanager(Alertmanager):
    """An Alertmanager in a gossip cluster on 127.0.0.1 (free ports), with short gossip intervals."""

    def __init__(
        self, workdir: Path, binary: str, webhook_url: str, peers: list[str], gossip_port: int
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir, binary, webhook_url)
        self.peers = peers
        self.gossip_port = gossip_port

    def command(self) -> list[str]:
        base = [arg for arg in super().command() if not arg.startswith("--cluster.listen-address")]
        return [
            *base,
            f"--cluster.listen-address=127.0.0.1:{self.gossip_port}",
            f"--cluster.advertise-address=127.0.0.1:{self.gossip_port}",
            *(f"--cluster.peer={peer}" for peer in self.peers),
            f"--cluster.peer-timeout={PEER_TIMEOUT_S}s",
            "--cluster.gossip-interval=100ms",
            "--cluster.pushpull-interval=1s",
            "--cluster.settle-timeout=2s",
        ]


def _prometheus(workdir: Path, binary: str, target: str, rules: Path, alertmanagers: list[int]) -> Prometheus:
    workdir.mkdir(parents=True, exist_ok=True)
    prom = Prometheus(
        workdir,
        binary,
        agent_targets=[],
        aggregator_targets=[target],
        rule_files=[rules],
        alertmanager_port=None,
    )
    config = yaml.safe_load(prom.config.read_text())
    config["scrape_configs"] = [c for c in config["scrape_configs"] if c["job_name"] == "sentinel-aggregator"]
    # an HA Prometheus pair: a replica label that differs, dropped before alerts are sent (docs/deploy.md)
    config["global"]["external_labels"]["replica"] = workdir.name
    config["alerting"] = {
        "alert_relabel_configs": [{"regex": "replica", "action": "labeldrop"}],
        "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{p}" for p in alertmanagers]}]}],
    }
    prom.config.write_text(yaml.safe_dump(config, sort_keys=False))
    return prom


async def test_one_faulty_gpu_seen_by_two_aggregators_is_one_notification(tmp_path: Path) -> None:
    prometheus_bin = need_binary("prometheus")
    am_bin = alertmanager_binary()
    need(am_bin is not None, "alertmanager not installed")
    assert am_bin is not None
    rules = tmp_path / "rules.yml"
    (source,) = [p for p in RULE_FILES if p.name == "sentinel.rules.yml"]
    fast_rules(source, rules)
    config = AggregatorConfig()
    config.fleet.cluster = "c1"  # both aggregators of an HA pair serve the same cluster
    async with AsyncExitStack() as stack:
        webhook = WebhookReceiver()
        await webhook.start()
        stack.push_async_callback(webhook.stop)
        a = await stack.enter_async_context(running_aggregator(tmp_path / "agg-a", config))
        b = await stack.enter_async_context(running_aggregator(tmp_path / "agg-b", config))
        gossip = [free_port(), free_port()]
        ams = [
            ClusteredAlertmanager(
                tmp_path / f"am{i}", am_bin, webhook.url, [f"127.0.0.1:{gossip[1 - i]}"], gossip[i]
            )
            for i in range(2)
        ]
        proms = [
            _prometheus(
                tmp_path / f"prom-{name}",
                prometheus_bin,
                url.removeprefix("http://"),
                rules,
                [am.port for am in ams],
            )
            for name, url in (("a", a.url), ("b", b.url))
        ]
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        )
        for process in (*ams, *proms):
            stack.callback(process.stop)
        await asyncio.gather(*(p.start(session) for p in (*ams, *proms)))

        xid: list[Event] = [kernel_xid(1.0, 3, 79)]
        for running in (a, b):  # one agent, streaming to both aggregators of the pair
            async with agent(running, "node-17") as conn:
                await conn.send(batch(1, 1.0, events=xid))
                assert await conn.ack() == 1

        def faulty(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [x for x in alerts if x["labels"].get("alertname") == "SentinelGpuFaulty"]

        await eventually(
            lambda: _async(faulty(webhook.alerts())), timeout=60, what="the faulty-GPU notification"
        )

        async def received_by_both() -> bool:
            counts = []
            for am in ams:
                async with session.get(am.url + "/api/v2/alerts") as response:
                    alerts = await response.json()
                counts.append(len([x for x in alerts if x["labels"].get("alertname") == "SentinelGpuFaulty"]))
            return counts == [1, 1]

        await eventually(received_by_both, timeout=30, what="both Alertmanagers holding the alert")
        # Both hold it; the second in the cluster would notify PEER_TIMEOUT_S after the first unless the
        # first one's notification log reached it. Give it well past that before counting.
        await asyncio.sleep(3 * PEER_TIMEOUT_S + 2)
        notified = faulty(webhook.alerts())
    labels = {k: notified[0]["labels"][k] for k in ("cluster", "host", "gpu", "reason")}
    assert labels == {"cluster": "c1", "host": "node-17", "gpu": "3", "reason": "xid_79"}
    assert len(notified) == 1, [n["labels"] for n in notified]
    assert "instance" not in notified[0]["labels"] and "replica" not in notified[0]["labels"]


async def _async(value: Any) -> Any:
    return value

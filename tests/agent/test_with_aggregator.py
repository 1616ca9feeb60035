"""The real agent against the real aggregator: stream, acks, host listed, snapshot command round trip."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import structlog

from sentinel.agent import Agent
from sentinel.wire import Command, SampleEntry, Snapshot, SnapshotRequest
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.aggregator.helpers import TOKEN, running_aggregator, wait_until


async def test_agent_streams_to_aggregator_and_answers_snapshot(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    async with running_aggregator(tmp_path / "aggregator") as running:
        config = make_config(
            tmp_path,
            stream={"enabled": True, "aggregator_url": running.stream_url, "token_file": str(token)},
            collect={"tick_s": 0.1},
        )
        source = FakeSource(gpus=4)
        agent = Agent(config, source)
        task = asyncio.create_task(agent.run())
        try:
            await wait_until(lambda: agent.counters.batches_acked >= 3)
            async with aiohttp.ClientSession() as session, session.get(f"{running.url}/api/v1/hosts") as r:
                assert r.status == 200
                hosts = await r.json()
            assert "host-test" in str(hosts)
            result = await running.aggregator.request(
                "host-test", Command(id="snap-1", request=SnapshotRequest(since=0.0)), 5.0
            )
            assert result is not None and result.ok
            assert isinstance(result.answer, Snapshot) and result.answer.host == "host-test"
            assert any(isinstance(e, SampleEntry) for e in result.answer.entries)
        finally:
            agent.request_stop()
            await asyncio.wait_for(task, 15)
    assert agent.spool is not None and len(agent.spool) == 0


async def test_missing_wrong_or_foreign_token_names_the_file_and_host_and_counts(tmp_path: Path) -> None:
    """A new user's mistakes with the token file: each says which file and host, and is counted."""
    token = tmp_path / "token"
    async with running_aggregator(tmp_path / "aggregator", tokens=[f"{TOKEN} rack-*"]) as running:
        config = make_config(
            tmp_path,
            stream={
                "enabled": True,
                "aggregator_url": running.stream_url,
                "token_file": str(token),
                "backoff_initial_s": 0.05,
                "backoff_max_s": 0.1,
            },
            collect={"tick_s": 0.05},
        )
        agent = Agent(config, FakeSource(gpus=1))
        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(agent.run())
            try:
                # 1. no token file: no connection is even tried (no 401 loop), the file and host are named
                await wait_until(lambda: agent.counters.stream_refused["token_file"] >= 2)
                assert (
                    running.aggregator.metrics.registry.get_sample_value(
                        "sentinel_ingest_rejected_total", {"cluster": "default", "reason": "unauthorized"}
                    )
                    is None
                )
                # 2. a wrong token: the aggregator's 401 is reported against the file
                token.write_text("not-the-token\n")
                await wait_until(lambda: agent.counters.stream_refused["unauthorized"] >= 1)
                # 3. the right token for other hosts (rack-*): refused for this host (4003)
                token.write_text(TOKEN + "\n")
                await wait_until(lambda: agent.counters.stream_refused["host_not_allowed"] >= 1)
                assert agent.counters.batches_acked == 0
            finally:
                agent.request_stop()
                await asyncio.wait_for(task, 15)
    refusals = [e for e in logs if e["event"] == "aggregator_refused_agent"]
    assert {e["reason"] for e in refusals} == {"token_file", "unauthorized", "host_not_allowed"}
    for entry in refusals:
        assert entry["host"] == "host-test" and entry["token_file"] == str(token)
        assert str(token) in entry["problem"] and entry["log_level"] == "error"
    text = agent.render_metrics().decode()
    assert (
        'sentinel_agent_stream_refused_total{cluster="default",host="host-test",reason="host_not_allowed"}'
        in text
    )

"""The real agent against the real aggregator: stream, acks, host listed, snapshot command round trip."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from sentinel.agent import Agent
from sentinel.wire import Command
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
                "host-test", Command(id="snap-1", name="snapshot", args={"since": 0.0}), 5.0
            )
            assert result is not None and result.ok
            assert result.payload["host"] == "host-test"
            assert {e["type"] for e in result.payload["entries"]} >= {"sample"}
        finally:
            agent.request_stop()
            await asyncio.wait_for(task, 15)
    assert agent.spool is not None and len(agent.spool) == 0

"""The real agent streaming to two real aggregators (``stream.aggregator_urls``): both reach the same
verdicts; while one is down the other carries on and the spool keeps what the missing one has not acked;
when it comes back (same state directory) it is sent exactly its backlog and catches up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from sentinel.agent import Agent
from sentinel.aggregator.server import AGGREGATOR_KEY, Aggregator, create_app
from sentinel.config.agent import AgentConfig
from sentinel.config.aggregator import AggregatorConfig
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.aggregator.helpers import TOKEN, wait_until


class Served:
    """An in-process aggregator that can be stopped and started again on the same port and state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.port = 0
        self.runner: web.AppRunner | None = None
        self.app: web.Application | None = None

    async def start(self) -> None:
        config = AggregatorConfig()
        config.fleet.tick_s = 0.1
        self.app = create_app(config, tokens=[TOKEN], state_dir=self.state_dir)
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()
        self.runner = None

    @property
    def aggregator(self) -> Aggregator:
        assert self.app is not None
        return self.app[AGGREGATOR_KEY]

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/stream"

    def open(self) -> set[tuple[str, str | None, int | None, str]]:
        return {(v.kind, v.host, v.gpu, v.reason) for v in self.aggregator.engine.book.open.values()}


async def two_aggregators(tmp_path: Path) -> tuple[Served, Served, AgentConfig]:
    """Aggregators A and B started, and an agent config streaming to both with quick reconnects."""
    a, b = Served(tmp_path / "a"), Served(tmp_path / "b")
    await a.start()
    await b.start()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    config = make_config(
        tmp_path,
        stream={
            "enabled": True,
            "aggregator_urls": [a.url, b.url],
            "token_file": str(token),
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.2,
        },
        collect={"tick_s": 0.05, "slow_tick_s": 0.2},
    )
    return a, b, config


async def test_two_aggregators_reach_the_same_verdicts_and_the_spool_serves_the_one_that_returns(
    tmp_path: Path,
) -> None:
    a, b, config = await two_aggregators(tmp_path)
    source = FakeSource(gpus=4)
    agent = Agent(config, source)
    task = asyncio.create_task(agent.run())
    try:
        source.push_xid(1, 79, 0.0)
        first = {("faulty", "host-test", 1, "xid_79")}
        await wait_until(lambda: a.open() == first and b.open() == first)
        assert agent.counters.aggregators == {a.url: True, b.url: True}

        await b.stop()  # B is lost; A carries on alone
        source.push_xid(2, 79, 0.0)
        second = first | {("faulty", "host-test", 2, "xid_79")}
        await wait_until(lambda: a.open() == second)
        await wait_until(lambda: agent.counters.aggregators.get(b.url) is False)
        assert agent.counters.connected  # the host's data still reaches an aggregator
        spool = agent.spool  # set once, in Agent.__init__
        assert spool is not None
        missed = spool.seqs(b.url)
        await wait_until(lambda: len(spool.seqs(b.url)) >= len(missed) + 5)
        assert len(spool.seqs(a.url)) <= config.stream.max_inflight  # A acks as it goes
        assert spool.seqs(b.url)[0] == missed[0]  # nothing B has not acked was dropped

        await b.start()  # same port, same state directory: restored, then sent its backlog
        assert b.open() == first  # restored from its state store before any agent spoke
        await wait_until(lambda: b.open() == second)
        await wait_until(lambda: len(spool.seqs(b.url)) <= config.stream.max_inflight)
        backlog = b.aggregator.engine.fleet.hosts["host-test"]
        assert backlog.batches >= len(missed)
        assert backlog.duplicates == 0  # the backlog was what B missed, nothing it already had
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)
        await a.stop()
        if b.runner is not None:
            await b.stop()
    assert agent.spool is not None and len(agent.spool) == 0  # both acked everything: the spool is empty


async def test_each_aggregators_acks_survive_an_agent_restart(tmp_path: Path) -> None:
    """B is down while the agent restarts: the new agent sends A only new batches and B its whole backlog —
    in the end both have applied every batch exactly once."""
    a, b, config = await two_aggregators(tmp_path)

    def host(served: Served) -> Any:
        return served.aggregator.engine.fleet.hosts["host-test"]

    source = FakeSource(gpus=4)
    agent = Agent(config, source)
    task = asyncio.create_task(agent.run())
    restarted: Agent | None = None
    try:
        source.push_xid(1, 79, 0.0)
        await wait_until(lambda: a.open() == b.open() == {("faulty", "host-test", 1, "xid_79")})
        await b.stop()
        applied_by_b = host(b).batches  # B restarts with an empty host view: count what it had
        source.push_xid(2, 79, 0.0)
        await wait_until(lambda: len(a.open()) == 2)
        assert agent.spool is not None
        await wait_until(lambda: len(agent.spool.seqs(b.url)) >= 5)  # type: ignore[union-attr]
        agent.request_stop()
        await asyncio.wait_for(task, 15)
        backlog = agent.spool.seqs(b.url)
        assert agent.spool.seqs(a.url) == []  # A acked everything before the agent stopped
        applied_by_a = host(a).batches

        restarted = Agent(config, FakeSource(gpus=4))
        made = set(range(agent.seq.next))  # the batches of the first run, then those of the second
        first_of_second = restarted.seq.next
        task = asyncio.create_task(restarted.run())
        assert restarted.spool is not None
        assert restarted.spool.seqs(b.url) == backlog  # the acks were read back: B's backlog, none of A's
        assert restarted.spool.seqs(a.url) == []
        await wait_until(lambda: host(a).batches >= applied_by_a + 5)  # new batches reach A
        assert host(a).duplicates == 0  # and nothing A had acked was sent to it again

        await b.start()
        await wait_until(lambda: b.open() == a.open())  # the second Xid reaches B from the backlog
        await wait_until(lambda: len(restarted.spool.seqs(b.url)) <= config.stream.max_inflight)  # type: ignore[union-attr]
    finally:
        (restarted or agent).request_stop()
        await asyncio.wait_for(task, 15)
        await a.stop()
        if b.runner is not None:
            await b.stop()
    assert restarted is not None and restarted.spool is not None and len(restarted.spool) == 0
    made |= set(range(first_of_second, restarted.seq.next))
    assert host(a).duplicates == host(b).duplicates == 0  # nothing sent twice to either
    assert host(a).batches == len(made)  # nothing lost for A: every batch applied once
    assert applied_by_b + host(b).batches == len(made)  # nor for B, before its outage and after

"""The fleet read path: an HA pair of cluster c1, one aggregator of cluster c2 and one that is down, read as
one API; the pair's copies of a verdict are one entry, the dead aggregator is named, the rest answers."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from aiohttp import web

from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig
from sentinel.fleet import create_fleet_app, merge_verdicts
from sentinel.wire import Event, XidOccurred
from tests.aggregator.helpers import agent, batch, running_aggregator, wait_until
from tests.aggregator.procs import free_port


def _config(cluster: str) -> AggregatorConfig:
    config = AggregatorConfig()
    config.fleet.cluster = cluster
    return config


async def test_fleet_api_merges_clusters_folds_ha_copies_and_names_the_missing(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_aggregator(tmp_path / "a", _config("c1")))
        b = await stack.enter_async_context(running_aggregator(tmp_path / "b", _config("c1")))
        c = await stack.enter_async_context(running_aggregator(tmp_path / "c", _config("c2")))
        xid: list[Event] = [XidOccurred(t=1.0, gpu=2, record=xid_record(79))]
        for running in (a, b):  # an agent streaming to both of c1's aggregators
            async with agent(running, "c1-node-1") as conn:
                await conn.send(batch(1, 1.0, events=xid))
                assert await conn.ack() == 1
        async with agent(c, "c2-node-7") as conn:
            await conn.send(batch(1, 1.0, events=[XidOccurred(t=1.0, gpu=5, record=xid_record(79))]))
            assert await conn.ack() == 1
        await wait_until(lambda: all(r.aggregator.engine.book.open for r in (a, b, c)))
        dead = f"http://127.0.0.1:{free_port()}"
        app = create_fleet_app([a.url, b.url, c.url, dead], timeout_s=2.0)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        fleet = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with aiohttp.ClientSession() as session:
            async with session.get(fleet + "/api/v1/verdicts?state=open") as response:
                answer = await response.json()
            async with session.get(fleet + "/api/v1/hosts") as response:
                hosts = await response.json()
            async with session.get(fleet + "/") as response:
                assert response.status == 200 and "text/html" in response.headers["Content-Type"]
    got = sorted(
        (v["cluster"], v["host"], v["gpu"], v["reason"], len(v["sources"])) for v in answer["verdicts"]
    )
    assert got == [("c1", "c1-node-1", 2, "xid_79", 2), ("c2", "c2-node-7", 5, "xid_79", 1)]
    assert [e["url"] for e in answer["errors"]] == [dead]
    assert sorted((h["cluster"], h["name"]) for h in hosts["hosts"]) == [
        ("c1", "c1-node-1"),
        ("c2", "c2-node-7"),
    ]


def test_copies_far_apart_in_time_are_two_verdicts() -> None:
    base = {"cluster": "c1", "kind": "faulty", "host": "h", "gpu": 1, "job": None, "rank": None}
    items = [
        {**base, "reason": "xid_79", "state": "closed", "opened_at": 100.0, "source": "a"},
        {**base, "reason": "xid_79", "state": "closed", "opened_at": 101.0, "source": "b"},
        {**base, "reason": "xid_79", "state": "closed", "opened_at": 900.0, "source": "a"},
    ]
    merged = merge_verdicts(items)
    assert [(v["opened_at"], v["sources"]) for v in merged] == [(100.0, ["a", "b"]), (900.0, ["a"])]

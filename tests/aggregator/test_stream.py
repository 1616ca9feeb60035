"""Ingest on real sockets (127.0.0.1): authentication, limits, bad frames, dedup, reconnect storms."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import tracemalloc
from pathlib import Path

import aiohttp
import msgspec
import pytest

from sentinel.config.aggregator import AggregatorConfig, LimitsConfig
from sentinel.wire import Batch, LogLine, encode
from tests.aggregator.helpers import TOKEN, agent, batch, hello, running_aggregator, sample, wait_until


async def connect(
    url: str, token: str | None = TOKEN
) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    session = aiohttp.ClientSession()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        ws = await session.ws_connect(url, headers=headers, max_msg_size=0)
    except BaseException:
        await session.close()
        raise
    return session, ws


async def closed_with(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    msg = await ws.receive(timeout=5.0)
    while msg.type == aiohttp.WSMsgType.BINARY:  # acks before the close
        msg = await ws.receive(timeout=5.0)
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING), msg
    return ws.close_code


def rejected(running: object, reason: str) -> float:
    registry = running.aggregator.metrics.registry  # type: ignore[attr-defined]
    value = registry.get_sample_value(
        "sentinel_ingest_rejected_total", {"cluster": "default", "reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize("token", [None, "wrong-token", "", TOKEN + "x"])
async def test_bad_or_missing_token_is_refused_with_401(tmp_path: Path, token: str | None) -> None:
    async with running_aggregator(tmp_path) as running:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await connect(running.stream_url, token)
        assert info.value.status == 401
        assert rejected(running, "unauthorized") == 1
        assert running.aggregator.engine.fleet.hosts == {}


async def test_malformed_frames_close_only_that_connection(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "good-host") as good:
        cases = [
            (b"\xc1\xff not msgpack", 1007),
            (msgspec.msgpack.encode({"type": "batch", "seq": "x"}), 1007),
            (msgspec.msgpack.encode({"type": "nonsense"}), 1007),
        ]
        for seq, (payload, code) in enumerate(cases):
            session, ws = await connect(running.stream_url)
            try:
                await ws.send_bytes(encode(hello("bad-host")))
                await ws.send_bytes(payload)
                assert await closed_with(ws) == code
            finally:
                await session.close()
            await good.send(batch(seq, time.time()))  # the other agent never notices
            assert await good.ack() == seq
        assert rejected(running, "malformed") == len(cases)
        assert not running.aggregator.by_host["good-host"].ws.closed


async def test_text_frames_batch_before_hello_bad_hello_and_oversized_batches(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_samples_per_batch=16, max_gpus_per_host=8))
    async with running_aggregator(tmp_path, config) as running:
        scripts: list[tuple[list[bytes | str], int]] = [
            (["hello as text"], 1003),
            ([encode(batch(0, time.time()))], 1008),
            ([encode(hello("bad host name!"))], 1008),
            ([encode(hello("too-many-gpus", gpus=9))], 1008),
            ([encode(hello("big")), encode(Batch(seq=0, t=0.0, samples=[sample(0, 0.0)] * 17))], 1008),
            ([encode(hello("twice")), encode(hello("twice"))], 1008),
        ]
        for frames, code in scripts:
            session, ws = await connect(running.stream_url)
            try:
                for frame in frames:
                    if isinstance(frame, str):
                        await ws.send_str(frame)
                    else:
                        await ws.send_bytes(frame)
                assert await closed_with(ws) == code, frames
            finally:
                await session.close()
        async with aiohttp.ClientSession() as session, session.get(running.url + "/healthz") as health:
            assert health.status == 200
        assert rejected(running, "text_frame") == 1 and rejected(running, "bad_hello") == 2


async def test_frames_over_the_size_limit_are_refused_with_1009(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_frame_bytes=64 * 1024))
    async with running_aggregator(tmp_path, config) as running, agent(running, "good-host") as good:
        session, ws = await connect(running.stream_url)
        try:
            await ws.send_bytes(encode(hello("big-host")))
            big = Batch(seq=0, t=0.0, events=[LogLine(t=0.0, text="x" * 4000) for _ in range(40)])
            await ws.send_bytes(encode(big))
            assert await closed_with(ws) == 1009
        finally:
            await session.close()
        await good.send(batch(0, time.time()))
        assert await good.ack() == 0
        await wait_until(lambda: rejected(running, "frame_too_large") == 1)


async def test_resent_batches_are_acked_and_applied_once(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running:
        t = time.time()
        async with agent(running, "h1") as a:
            for seq in (0, 1, 2):
                await a.send(batch(seq, t + seq))
                assert await a.ack() == seq
        async with agent(running, "h1") as a:  # reconnect, resend 1 and 2, then go on
            for seq in (1, 2, 3):
                await a.send(batch(seq, t + seq))
                assert await a.ack() == seq
        host = running.aggregator.engine.fleet.hosts["h1"]
        assert (host.batches, host.duplicates) == (4, 2)
        registry = running.aggregator.metrics.registry
        assert registry.get_sample_value("sentinel_ingest_batches_total", {"cluster": "default"}) == 4
        assert registry.get_sample_value("sentinel_ingest_samples_total", {"cluster": "default"}) == 32


async def test_a_newer_connection_replaces_the_older_one_for_the_same_host(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "h1") as first:
        await first.send(batch(0, time.time()))
        assert await first.ack() == 0
        first_socket = running.aggregator.by_host["h1"].ws
        async with agent(running, "h1") as second:
            await second.send(batch(1, time.time()))
            assert await second.ack() == 1
            assert await closed_with(first.ws) == 4000
            # the old socket is let go once its close handshake is over (asynchronously, after the frame)
            await wait_until(lambda: len(running.aggregator.connections) == 1)
            assert running.aggregator.by_host["h1"].ws is not first_socket


async def test_connection_limit_answers_503_and_keeps_serving(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_connections=2))
    async with running_aggregator(tmp_path, config) as running, agent(running, "a") as a, agent(running, "b"):
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await connect(running.stream_url)
        assert info.value.status == 503
        await a.send(batch(0, time.time()))
        assert await a.ack() == 0


async def test_reconnect_storm_of_every_agent_keeps_serving_and_memory_bounded(tmp_path: Path) -> None:
    hosts = 150
    async with running_aggregator(tmp_path) as running, agent(running, "steady") as steady:
        aggregator = running.aggregator
        seq = 0

        async def one(name: str, round_: int) -> None:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(
                    running.stream_url, headers={"Authorization": f"Bearer {TOKEN}"}
                )
                await ws.send_bytes(encode(hello(name)))
                await ws.send_bytes(encode(batch(round_, time.time())))
                await ws.receive(timeout=30)
                await ws.close()

        async def storm(round_: int) -> None:
            nonlocal seq
            task = asyncio.gather(*(one(f"node-{i:04d}", round_) for i in range(hosts)))
            while not task.done():  # the steady agent is served during the storm
                started = time.monotonic()
                await steady.send(batch(seq, time.time()))
                assert await steady.ack(timeout=10) == seq
                assert time.monotonic() - started < 5.0
                seq += 1
                await asyncio.sleep(0.05)
            await task

        tracemalloc.start()
        try:
            await storm(0)
            await wait_until(lambda: len(aggregator.connections) == 1)
            gc.collect()
            after_first = tracemalloc.get_traced_memory()[0]
            for round_ in range(1, 5):
                await storm(round_)
            await wait_until(lambda: len(aggregator.connections) == 1)
            gc.collect()
            after_five = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(aggregator.engine.fleet.hosts) == hosts + 1
        assert set(aggregator.by_host) == {"steady"} and not aggregator.pending
        assert all(h.batches == 5 for name, h in aggregator.engine.fleet.hosts.items() if name != "steady")
        growth = after_five - after_first
        assert growth < 8 * 1024 * 1024, f"memory grew by {growth} bytes over four storms"
        if os.environ.get("SENTINEL_VERBOSE"):
            print(f"storm memory growth: {growth} bytes")

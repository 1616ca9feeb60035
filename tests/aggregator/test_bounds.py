"""Bounds on real sockets: what an agent reports it dropped is accounted, sizes and times are bounded."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import msgspec
import pytest
import structlog

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.loop import LoopErrorLimiter
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.config.aggregator import AggregatorConfig, FleetConfig, LimitsConfig, ServerConfig
from sentinel.fr.heads import MAX_IN_FLIGHT, MAX_PG_RANKS, FrHeads, InFlight, PgHead
from sentinel.wire import Batch, Drops, Hello, ProcInfo
from tests.aggregator.helpers import TOKEN, agent, batch, hello, running_aggregator, sample, wait_until


def reported_drops(running: object, host: str, what: str) -> float | None:
    registry = running.aggregator.metrics.registry  # type: ignore[attr-defined]
    value: float | None = registry.get_sample_value(
        "sentinel_agent_reported_drops_total", {"cluster": "default", "host": host, "what": what}
    )
    return value


async def test_batch_drops_are_counted_per_host_and_logged(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "host-a") as conn:
        with structlog.testing.capture_logs() as logs:
            for seq, drops in enumerate((Drops(samples=120, probe=3), Drops(samples=5), Drops(events=-7))):
                frame = batch(seq, time.time())
                frame.drops = drops
                await conn.send(frame)
                assert await conn.ack() == seq
            # a resend is not counted twice
            frame = batch(0, time.time())
            frame.drops = Drops(samples=120)
            await conn.send(frame)
            assert await conn.ack() == 0
        assert reported_drops(running, "host-a", "samples") == 125
        assert reported_drops(running, "host-a", "probe") == 3
        assert reported_drops(running, "host-a", "events") is None  # a negative count is nonsense, ignored
        lines = [e for e in logs if e["event"] == "agent_reported_drops"]
        assert len(lines) == 1 and lines[0]["host"] == "host-a"  # one line a minute per host, not per batch


async def closed_with(conn: object) -> int | None:
    ws = conn.ws  # type: ignore[attr-defined]
    msg = await ws.receive(timeout=5.0)
    while msg.type == aiohttp.WSMsgType.BINARY:
        msg = await ws.receive(timeout=5.0)
    return ws.close_code  # type: ignore[no-any-return]


def heads(
    rank: int, *, ranks: list[int] | None = None, in_flight: int = 0, world: int = 16, t: float = 0.0
) -> FrHeads:
    flights = [InFlight(seq=100 + i, op="allreduce", age_s=30.0, state="started") for i in range(in_flight)]
    pg = PgHead(pg_name="0", pg_desc="default_pg", ranks=ranks, last_enqueued_seq=99 + in_flight,
                last_completed_seq=99, in_flight=flights)  # fmt: skip
    return FrHeads(rank=rank, t=t, job_id="job-1", world_size=world, pgs=[pg])


async def test_lists_beyond_the_wire_bounds_are_refused_by_the_decoder(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "host-a") as conn:
        huge = {"type": "batch", "seq": 0, "t": time.time(),
                "heads": [{"rank": 0, "t": 1.0, "pgs": [{"pg_name": "0", "ranks": list(range(MAX_PG_RANKS + 1))}]}]}  # fmt: skip
        await conn.ws.send_bytes(msgspec.msgpack.encode(huge))
        assert await closed_with(conn) == 1007
    async with running_aggregator(tmp_path) as running, agent(running, "host-a") as conn:
        throttles = {
            "type": "batch",
            "seq": 0,
            "t": 1.0,
            "samples": [{"gpu": 0, "t": 1.0, "throttle": ["x"] * 1000}],
        }
        await conn.ws.send_bytes(msgspec.msgpack.encode(throttles))
        assert await closed_with(conn) == 1007


async def test_too_many_procs_or_heads_items_in_one_batch_close_with_1008(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "host-a") as conn:
        procs = [
            ProcInfo(gpu=0, pid=i, job_id="j", rank=i) for i in range(LimitsConfig().max_procs_per_batch + 1)
        ]
        await conn.send(Batch(seq=0, t=time.time(), procs=procs))
        assert await closed_with(conn) == 1008
    config = AggregatorConfig(limits=LimitsConfig(max_heads_items_per_batch=1000))
    async with running_aggregator(tmp_path, config) as running, agent(running, "host-a") as conn:
        await conn.send(
            Batch(seq=0, t=time.time(), heads=[heads(r, ranks=list(range(600))) for r in range(2)])
        )
        assert await closed_with(conn) == 1008
        assert running.aggregator.engine.fleet.jobs == {}


def test_every_rank_of_a_group_shares_one_ranks_list() -> None:
    engine = Engine(AggregatorConfig())
    host = engine.hello(Hello(host="host-a"), 0.0)
    members = list(range(4096))
    engine.ingest(
        host, Batch(seq=0, t=1.0, heads=[heads(r, ranks=list(members), world=4096) for r in range(64)]), 1.0
    )
    job = engine.fleet.jobs["job-1"]
    lists = {id(view.heads.pgs[0].ranks) for view in job.ranks.values() if view.heads is not None}
    assert len(job.ranks) == 64 and len(lists) == 1


def test_stuck_detection_work_per_tick_is_bounded_whatever_the_heads_claim() -> None:
    """One rank claims world size 131,072 with 256 collectives in flight; the tick stays bounded."""
    engine = Engine(AggregatorConfig())
    host = engine.hello(Hello(host="host-a"), 0.0)
    engine.ingest(host, Batch(seq=0, t=1.0, heads=[heads(0, in_flight=MAX_IN_FLIGHT, world=131072)]), 1.0)
    engine.fleet.jobs["job-1"].last_progress_at = -100.0
    started = time.process_time()
    changes = engine.tick(2.0)
    cost = time.process_time() - started
    stuck = [c for c in changes if c.verdict.kind == "stuck"]
    assert 0 < len(stuck) <= AggregatorConfig().detect.stuck.max_culprits
    print(f"tick with world 131072 x {MAX_IN_FLIGHT} in flight: {cost:.3f} s CPU")


async def test_sockets_that_never_finish_their_headers_or_their_hello_are_closed(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(header_timeout_s=0.3, hello_timeout_s=0.3))
    async with running_aggregator(tmp_path, config) as running:
        port = int(running.url.rsplit(":", 1)[1])
        # slowloris: half a request line, then nothing
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /api/v1/stream HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed by the aggregator, not by us
        writer.close()
        # upgraded, authenticated, but never a Hello
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(running.stream_url, headers={"Authorization": f"Bearer {TOKEN}"})
            msg = await ws.receive(timeout=5.0)
            assert msg.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1008
            assert "hello_timeout" in str(msg.extra)
        await wait_until(lambda: running.aggregator.connections == set())


async def test_one_peer_cannot_take_every_connection(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_streams_per_peer=2))
    async with running_aggregator(tmp_path, config) as running:
        async with agent(running, "host-a"), agent(running, "host-b"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                async with agent(running, "host-c"):
                    pass
            assert info.value.status == 503
        async with agent(running, "host-c") as conn:  # the slots are given back
            await conn.send(batch(0, time.time()))
            assert await conn.ack() == 0


def test_loop_errors_are_counted_and_logged_at_most_every_10_s() -> None:
    now = [0.0]
    metrics = AggregatorMetrics("default")
    limiter = LoopErrorLimiter(metrics, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    try:
        with structlog.testing.capture_logs() as logs:
            error = OSError(24, "Too many open files")
            for i in range(5000):
                now[0] = i * 0.001  # 5,000 failed accepts in 5 s
                limiter(loop, {"message": "socket.accept() out of system resource", "exception": error})
            now[0] = 11.0
            limiter(loop, {"message": "socket.accept() out of system resource", "exception": error})
    finally:
        loop.close()
    lines = [e for e in logs if e["event"] == "loop_error"]
    assert len(lines) == 2 and lines[1]["suppressed"] == 4999 and lines[0]["kind"] == "OSError"
    assert (
        metrics.registry.get_sample_value(
            "sentinel_aggregator_loop_errors_total", {"cluster": "default", "kind": "OSError"}
        )
        == 5001
    )


def test_a_sample_stamped_a_year_ahead_does_not_freeze_the_gpu() -> None:
    engine = Engine(AggregatorConfig())
    host = engine.hello(hello("host-a", gpus=1), 1000.0)
    engine.ingest(
        host, Batch(seq=0, t=1000.0, samples=[sample(0, 1000.0 + 365 * 86400, temp_c=20.0)]), 1000.0
    )
    engine.ingest(host, Batch(seq=1, t=1001.0, samples=[sample(0, 1001.0, temp_c=91.0)]), 1001.0)
    gpu = engine.fleet.hosts["host-a"].gpus[0]
    assert gpu.t == 1001.0 and gpu.temp == 91.0
    assert engine.fleet.future_stamped == 1


def test_jobs_known_only_from_heads_end_when_their_heads_stop() -> None:
    engine = Engine(AggregatorConfig())
    host = engine.hello(Hello(host="host-a"), 0.0)
    engine.ingest(host, Batch(seq=0, t=0.0, heads=[heads(r) for r in range(4)]), 0.0)
    assert "job-1" in engine.fleet.jobs
    engine.tick(10.0)
    assert "job-1" in engine.fleet.jobs  # recent heads: still running
    engine.tick(100.0)
    assert "job-1" not in engine.fleet.jobs


def test_silent_hosts_are_forgotten_after_the_retention_and_their_verdicts_close() -> None:
    config = AggregatorConfig(fleet=FleetConfig(host_forget_after_s=3600.0))
    engine = Engine(config)
    for name in ("gone", "here"):
        engine.hello(hello(name, gpus=1), 0.0)
    engine.disconnected("gone")
    engine.tick(60.0)
    assert any(v.host == "gone" and v.kind == "host_silent" for v in engine.book.open.values())
    engine.fleet.hosts["here"].last_seen = 3700.0
    changes = engine.tick(3700.0)
    assert set(engine.fleet.hosts) == {"here"}
    assert any(c.what == "closed" and c.verdict.host == "gone" for c in changes)
    assert not any(v.host == "gone" for v in engine.book.open.values())


async def test_max_hosts_makes_room_for_a_new_real_host(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_hosts=3))
    offset = [0.0]
    async with running_aggregator(tmp_path, config, clock=lambda: time.time() + offset[0]) as running:
        for name in ("fake-1", "fake-2", "fake-3"):
            async with agent(running, name) as conn:
                await conn.send(batch(0, time.time()))
                await conn.ack()
        await wait_until(lambda: not running.aggregator.by_host)
        offset[0] = 60.0  # a minute later: past host_silent_after_s
        async with agent(running, "real-new") as conn:  # was refused for ever once max_hosts was reached
            await conn.send(batch(0, time.time()))
            assert await conn.ack() == 0
        assert "real-new" in running.aggregator.engine.fleet.hosts
        assert len(running.aggregator.engine.fleet.hosts) == 3


async def test_rest_answers_are_paginated(tmp_path: Path) -> None:
    config = AggregatorConfig(server=ServerConfig(api_page_size=50))
    async with running_aggregator(tmp_path, config) as running:
        engine = running.aggregator.engine
        for i in range(120):
            engine.hello(hello(f"host-{i:03d}", gpus=1), time.time())
        names: list[str] = []
        offset: int | None = 0
        async with aiohttp.ClientSession() as session:
            while offset is not None:
                async with session.get(f"{running.url}/api/v1/hosts", params={"offset": offset}) as resp:
                    page = await resp.json()
                assert len(page["hosts"]) <= 50 and page["total"] == 120
                names.extend(h["name"] if "name" in h else h["host"] for h in page["hosts"])
                offset = page["next_offset"]
            async with session.get(f"{running.url}/api/v1/hosts", params={"limit": "x"}) as resp:
                assert resp.status == 400
        assert names == [f"host-{i:03d}" for i in range(120)]


async def test_a_read_token_guards_the_rest_api_but_not_metrics_health_or_agents(tmp_path: Path) -> None:
    tokens = tmp_path / "api-tokens"
    tokens.write_text("# read tokens\nreader-secret\n")
    config = AggregatorConfig(server=ServerConfig(api_token_file=str(tokens)))
    async with running_aggregator(tmp_path, config) as running, aiohttp.ClientSession() as session:
        for path in (
            "/api/v1/verdicts",
            "/api/v1/hosts",
            "/api/v1/jobs",
            "/api/v1/incidents",
            "/api/v1/incidents/x",
        ):
            async with session.get(running.url + path) as resp:
                assert resp.status == 401, path
            async with session.get(running.url + path, headers={"Authorization": "Bearer wrong"}) as resp:
                assert resp.status == 401, path
        good = {"Authorization": "Bearer reader-secret"}
        async with session.get(running.url + "/api/v1/verdicts", headers=good) as resp:
            assert resp.status == 200
        for path in ("/healthz", "/metrics"):
            async with session.get(running.url + path) as resp:
                assert resp.status == 200, path
        async with agent(running, "host-a") as conn:  # agents use their own tokens
            await conn.send(batch(0, time.time()))
            assert await conn.ack() == 0


async def test_a_stream_that_goes_silent_is_closed_after_the_idle_timeout_and_one_that_talks_is_not(
    tmp_path: Path,
) -> None:
    """One watchdog per connection (not a timer per frame): a silent agent is closed with idle_timeout once
    idle_timeout_s has passed since its last frame; an agent sending more often than that stays open."""
    config = AggregatorConfig(limits=LimitsConfig(hello_timeout_s=5.0, idle_timeout_s=0.6))
    async with (
        running_aggregator(tmp_path, config) as running,
        agent(running, "host-talks") as talks,
        agent(running, "host-silent") as silent,
    ):
        started = time.monotonic()
        for seq in range(8):  # 2 s of batches every 0.25 s: well past the idle timeout in total
            await talks.send(batch(seq, float(seq)))
            assert await talks.ack() == seq
            await asyncio.sleep(0.25)
        msg = await silent.ws.receive(timeout=5.0)
        assert msg.type == aiohttp.WSMsgType.CLOSE and silent.ws.close_code == 1008
        assert "idle_timeout" in str(msg.extra)
        assert time.monotonic() - started < 5.0  # the idle timeout, not the hello timeout
        assert not talks.ws.closed
        await talks.send(batch(8, 8.0))
        assert await talks.ack() == 8

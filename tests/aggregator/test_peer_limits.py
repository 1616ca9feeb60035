"""Per-peer TCP limits at accept and refusals that cannot flood the log, on real sockets on 127.0.0.1.

The flooding peer connects from 127.0.0.2 (still the loopback interface, a different peer address), so the
test can show that the real agents on 127.0.0.1 are unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from sentinel.aggregator.identity import server_ssl_context
from sentinel.aggregator.listener import AggregatorSite
from sentinel.aggregator.refusals import RefusalLog
from sentinel.aggregator.server import AGGREGATOR_KEY, create_app
from sentinel.config.aggregator import AggregatorConfig, LimitsConfig, ServerConfig
from tests.aggregator.helpers import TOKEN, Running, agent, batch, running_aggregator, wait_until
from tests.aggregator.test_identity import make_pki

FLOODER = "127.0.0.2"


def rejected(running: Running, reason: str) -> float:
    value = running.aggregator.metrics.registry.get_sample_value(
        "sentinel_ingest_rejected_total", {"cluster": "default", "reason": reason}
    )
    return value or 0.0


async def open_idle(port: int, source: str = FLOODER) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that never sends anything."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closed (or reset) the connection without waiting for a request."""
    try:
        return await asyncio.wait_for(reader.read(1), 5.0) == b""
    except ConnectionError:
        return True


def port_of(running: Running) -> int:
    return int(running.url.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def idle_flood(port: int, n: int) -> AsyncIterator[list[asyncio.StreamWriter]]:
    writers = []
    try:
        for _ in range(n):
            writers.append((await open_idle(port))[1])
        yield writers
    finally:
        for writer in writers:
            writer.close()


async def test_an_idle_socket_flood_from_one_address_is_cut_at_accept(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_connections_per_peer=8, max_connections=8))
    async with running_aggregator(tmp_path, config) as running:
        gate = running.aggregator.peer_gate
        port = port_of(running)
        async with idle_flood(port, 8):
            await wait_until(lambda: gate.open.get(FLOODER) == 8)
            refused = []
            for _ in range(20):  # each one beyond the limit is closed before anything is read
                reader, writer = await open_idle(port)
                refused.append(await closed_by_server(reader))
                writer.close()
            assert all(refused)
            assert gate.open[FLOODER] == 8
            assert rejected(running, "peer_connection_limit") == 20
            # a real agent from another address is not affected: the flood holds no stream slot
            async with agent(running, "host-a") as conn:
                await conn.send(batch(0, time.time()))
                assert await conn.ack() == 0
            assert rejected(running, "too_many_connections") == 0
        # the flood's sockets close: its slots are given back
        await wait_until(lambda: FLOODER not in gate.open)
        _, writer = await open_idle(port)
        await wait_until(lambda: gate.open.get(FLOODER) == 1)
        writer.close()
        assert rejected(running, "peer_connection_limit") == 20


async def test_sockets_that_never_finish_a_tls_handshake_are_counted_too(tmp_path: Path) -> None:
    make_pki(tmp_path)
    server = ServerConfig(
        tls_cert_file=str(tmp_path / "server.pem"), tls_key_file=str(tmp_path / "server.key")
    )
    config = AggregatorConfig(server=server, limits=LimitsConfig(max_connections_per_peer=4))
    app = create_app(config, tokens=[f"{TOKEN} host-*"], state_dir=tmp_path)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = AggregatorSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(server))
    await site.start()
    port = runner.addresses[0][1]
    aggregator = app[AGGREGATOR_KEY]
    try:
        async with idle_flood(port, 4):
            await wait_until(lambda: aggregator.peer_gate.open.get(FLOODER) == 4)
            reader, writer = await open_idle(port)
            assert await closed_by_server(reader)
            writer.close()
            # TLS still works for a real agent (127.0.0.1) behind the gate
            context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
            async with aiohttp.ClientSession() as session:
                url = f"wss://127.0.0.1:{port}/api/v1/stream"
                ws = await session.ws_connect(url, headers={"Authorization": f"Bearer {TOKEN}"}, ssl=context)
                await ws.close()
        assert (
            aggregator.metrics.registry.get_sample_value(
                "sentinel_ingest_rejected_total", {"cluster": "default", "reason": "peer_connection_limit"}
            )
            == 1
        )
        await wait_until(lambda: not aggregator.peer_gate.open)
    finally:
        await runner.cleanup()


async def test_a_flood_of_refusals_writes_a_few_log_lines_and_counts_every_one(tmp_path: Path) -> None:
    config = AggregatorConfig(limits=LimitsConfig(max_connections_per_peer=2))
    async with running_aggregator(tmp_path, config) as running:
        now = [1000.0]
        running.aggregator.refusals.clock = lambda: now[0]
        port = port_of(running)
        with structlog.testing.capture_logs() as logs:
            async with aiohttp.ClientSession() as session:
                for _ in range(60):  # a wrong token, retried in a tight loop
                    async with session.get(
                        f"{running.url}/api/v1/stream", headers={"Authorization": "Bearer wrong"}
                    ) as response:
                        assert response.status == 401
            async with idle_flood(port, 2):
                await wait_until(lambda: running.aggregator.peer_gate.open.get(FLOODER) == 2)
                for _ in range(40):
                    reader, writer = await open_idle(port)
                    assert await closed_by_server(reader)
                    writer.close()
            during = list(logs)
            running.aggregator.refusals.flush()  # the window is not over: nothing more yet
            assert len(logs) == len(during)
            now[0] += 10.0
            running.aggregator.refusals.flush()  # what the tick loop does once the window is over
        assert rejected(running, "unauthorized") == 60
        assert rejected(running, "peer_connection_limit") == 40
        assert [e["event"] for e in during] == ["stream_unauthorized", "connection_refused"]
        assert during[1]["peer"] == FLOODER and during[1]["limit"] == 2
        summary = logs[len(during) :]
        assert len(summary) == 1 and summary[0]["event"] == "connections_refused"
        assert summary[0]["not_logged"] == {"peer_connection_limit": 39, "unauthorized": 59}
        assert summary[0]["total"] == 98


class _Metrics:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def rejected(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1


def test_refusal_log_logs_the_first_of_each_reason_per_window_and_sums_up_the_rest() -> None:
    now = [0.0]
    metrics = _Metrics()
    refusals = RefusalLog(metrics, every_s=10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        for i in range(1000):
            now[0] = i * 0.015  # 1,000 refusals over 15 s: two windows
            refusals.refused("malformed" if i % 2 else "unauthorized", "stream_closed", peer="10.0.0.9")
        now[0] = 30.0
        refusals.flush()
        refusals.flush()  # nothing left to sum up: no line
    assert metrics.counts == {"malformed": 500, "unauthorized": 500}
    events = [e["event"] for e in logs]
    # per window: the first refusal of each reason, then one summary (the first window's written by the next
    # refusal after it, the second by the tick loop's flush)
    assert events == ["stream_closed"] * 2 + ["connections_refused"] + ["stream_closed"] * 2 + [
        "connections_refused"
    ]
    assert (
        {logs[0]["reason"], logs[1]["reason"]}
        == {logs[3]["reason"], logs[4]["reason"]}
        == {
            "malformed",
            "unauthorized",
        }
    )
    first, second = logs[2], logs[5]
    assert first["total"] + second["total"] + 4 == 1000
    assert set(first["not_logged"]) == {"malformed", "unauthorized"}

"""server.reuse_port: aggregator processes on one machine share the listening port (SO_REUSEPORT).

Two aggregator apps stand for two processes here: each binds its own socket to the port the way the daemon
does (``make_site``), and the kernel hands each agent's connection to one of them. Two real daemons
(``sentinel aggregator run``) show the setting reaches the listener from the configuration file.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from sentinel.aggregator.server import AGGREGATOR_KEY, Aggregator, create_app, make_runner, make_site
from sentinel.config.aggregator import AggregatorConfig, ServerConfig
from sentinel.wire import Ack, decode_aggregator_frame, encode

from .helpers import TOKEN, batch, hello

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT here")


def config(port: int, reuse_port: bool) -> AggregatorConfig:
    return AggregatorConfig(
        server=ServerConfig(listen_host="127.0.0.1", listen_port=port, reuse_port=reuse_port)
    )


@asynccontextmanager
async def listening(cfg: AggregatorConfig, state_dir: Path) -> AsyncIterator[tuple[Aggregator, int]]:
    """An aggregator app listening as the daemon does: (its Aggregator, the port it bound)."""
    state_dir.mkdir()
    app = create_app(cfg, tokens=[TOKEN], state_dir=state_dir)
    runner: web.AppRunner = make_runner(app)
    await runner.setup()
    try:
        await make_site(runner).start()
        yield app[AGGREGATOR_KEY], runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def stream_one(session: aiohttp.ClientSession, url: str, host: str) -> aiohttp.ClientWebSocketResponse:
    """An agent's stream: hello and one batch, held open once its ack came."""
    ws = await session.ws_connect(url, headers={"Authorization": f"Bearer {TOKEN}"})
    await ws.send_bytes(encode(hello(host)))
    await ws.send_bytes(encode(batch(0, 1.0)))
    while True:
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        if isinstance(decode_aggregator_frame(msg.data), Ack):
            return ws


def test_reuse_port_is_off_by_default() -> None:
    assert ServerConfig().reuse_port is False


async def test_without_reuse_port_a_second_aggregator_cannot_bind_the_port(tmp_path: Path) -> None:
    async with listening(config(0, reuse_port=False), tmp_path / "a") as (_, port):
        with pytest.raises(OSError):
            async with listening(config(port, reuse_port=False), tmp_path / "b"):
                pass


async def test_two_aggregators_share_the_port_and_both_accept_agents(tmp_path: Path) -> None:
    hosts = [f"node{i:02d}" for i in range(32)]
    async with AsyncExitStack() as stack:
        first, port = await stack.enter_async_context(listening(config(0, reuse_port=True), tmp_path / "a"))
        second, same = await stack.enter_async_context(
            listening(config(port, reuse_port=True), tmp_path / "b")
        )
        assert same == port
        session = await stack.enter_async_context(aiohttp.ClientSession())
        url = f"ws://127.0.0.1:{port}/api/v1/stream"
        # each connection comes from its own source port, which the kernel hashes to one of the two sockets:
        # 32 streams all on one side is a 1 in 2**31 chance
        streams = await asyncio.gather(*(stream_one(session, url, host) for host in hosts))
        took = [set(first.by_host), set(second.by_host)]
        assert took[0] and took[1], took
        assert took[0].isdisjoint(took[1])
        assert took[0] | took[1] == set(hosts)
        assert not any(ws.closed for ws in streams)


def daemon(tmp_path: Path, name: str, port: int) -> tuple[subprocess.Popen[str], int]:
    """``sentinel aggregator run`` with ``server.reuse_port = true`` on ``port``: the process, its bound port."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[server]\nlisten_port = {port}\nreuse_port = true\ntokens_file = "{tokens}"\n'
        f'state_dir = "{tmp_path / name}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "aggregator", "run", "--config", str(path)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        record = json.loads(line)
        if record.get("event") == "aggregator_listening":
            return proc, int(record["addresses"][0].rsplit(":", 1)[1])
    proc.wait(timeout=10)
    raise AssertionError(f"{name} did not listen (exit {proc.returncode})")


def test_two_daemons_with_reuse_port_listen_on_one_port(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        first, port = daemon(tmp_path, "a", 0)
        procs.append(first)
        second, same = daemon(tmp_path, "b", port)
        procs.append(second)
        assert same == port
        assert first.poll() is None and second.poll() is None
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)

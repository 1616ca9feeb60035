"""The agent's WebSocket client and HTTP endpoint against real sockets: aiohttp at the other end where it is
the peer the agent meets, a raw asyncio server where the test must send what no well-behaved server would."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.agent.websocket import HandshakeError, ProtocolError, connect
from sentinel.rfc6455 import GUID
from sentinel.rfc6455 import xor_mask as mask

Peer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def raw_server(peer: Peer) -> tuple[asyncio.Server, str]:
    """A server that does the upgrade by hand, then lets ``peer`` write whatever frames it likes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        key = next(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("sec-websocket-key")
        )
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID, usedforsecurity=False).digest()).decode()
        writer.write(
            f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
        )
        await peer(reader, writer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/api/v1/stream"


def server_frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = False) -> bytes:
    n = len(payload)
    first = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        length = bytes([(0x80 if masked else 0) | n])
    elif n < 1 << 16:
        length = bytes([(0x80 if masked else 0) | 126]) + struct.pack("!H", n)
    else:
        length = bytes([(0x80 if masked else 0) | 127]) + struct.pack("!Q", n)
    if masked:
        return first + length + b"abcd" + mask(payload, b"abcd")
    return first + length + payload


@contextlib.asynccontextmanager
async def aiohttp_serving(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[int]:
    """An aiohttp server on 127.0.0.1 answering ``GET /s`` with ``handler``; yields its port."""
    app = web.Application()
    app.router.add_get("/s", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def test_echo_through_aiohttp_with_the_bearer_token() -> None:
    seen: list[str] = []

    async def stream(request: web.Request) -> web.WebSocketResponse:
        seen.append(request.headers.get("Authorization", ""))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            await ws.send_bytes(message.data[::-1])
        return ws

    async with aiohttp_serving(stream) as port:
        ws = await connect(
            f"ws://127.0.0.1:{port}/s",
            headers={"Authorization": "Bearer t0k"},
            ssl_context=None,
            max_msg_size=1 << 20,
        )
        for size in (0, 5, 125, 126, 65535, 65536, 300_000):
            data = bytes(range(256)) * (size // 256) + bytes(size % 256)
            await ws.send_bytes(data)
            assert await ws.receive() == data[::-1]
        await ws.close()
        assert ws.closed and ws.close_code == 1000
        assert seen == ["Bearer t0k"]


async def test_refused_upgrade_reports_the_status() -> None:
    async def stream(_: web.Request) -> web.Response:
        return web.Response(status=401)

    async with aiohttp_serving(stream) as port:
        with pytest.raises(HandshakeError) as refused:
            await connect(f"ws://127.0.0.1:{port}/s", headers={}, ssl_context=None, max_msg_size=1024)
        assert refused.value.status == 401


async def test_ping_answered_fragments_joined_and_close_code_kept() -> None:
    pong: list[bytes] = []
    ponged = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(server_frame(0x9, b"hb"))
        writer.write(server_frame(0x2, b"ab", fin=False) + server_frame(0x0, b"cd"))
        writer.write(server_frame(0x1, b"text is skipped") + server_frame(0x2, b"next"))
        writer.write(server_frame(0x8, struct.pack("!H", 4003)))
        head = await reader.readexactly(6)  # the pong: masked, 2-byte payload
        pong.append(mask(await reader.readexactly(head[1] & 0x7F), head[2:6]))
        ponged.set()

    server, url = await raw_server(peer)
    async with server:
        ws = await connect(url, headers={}, ssl_context=None, max_msg_size=1024)
        assert await ws.receive() == b"abcd"
        assert await ws.receive() == b"next"
        assert await ws.receive() is None
        assert ws.closed and ws.close_code == 4003
        async with asyncio.timeout(5):  # the peer reads what was sent before the close at its own pace
            await ponged.wait()
    assert pong == [b"hb"]


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        (server_frame(0x2, b"x" * 2000), "too large"),
        (server_frame(0x2, b"x" * 600, fin=False) + server_frame(0x0, b"x" * 600), "too large"),
        (server_frame(0x2, b"hi", masked=True), "masked"),
        (bytes([0x82 | 0x40, 2]) + b"hi", "reserved"),
        (server_frame(0x3, b"?"), "opcode"),
        (server_frame(0x0, b"orphan"), "continuation"),
    ],
)
async def test_frames_a_server_must_not_send_end_the_connection(frames: bytes, why: str) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frames)
        await writer.drain()
        await reader.read(64)

    server, url = await raw_server(peer)
    async with server:
        ws = await connect(url, headers={}, ssl_context=None, max_msg_size=1024)
        with pytest.raises(ProtocolError, match=why):
            await ws.receive()
        assert ws.closed


async def test_a_silent_server_is_pinged_then_dropped() -> None:
    pinged = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readexactly(6)
        if head[0] & 0x0F == 0x9:
            pinged.set()
        await reader.read()

    server, url = await raw_server(peer)
    async with server:
        ws = await connect(url, headers={}, ssl_context=None, max_msg_size=1024, heartbeat_s=0.05)
        assert await ws.receive() is None
        assert pinged.is_set() and ws.closed


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_from_the_server_end_in_a_message_a_close_or_an_error(garbage: bytes) -> None:
    async def run() -> None:
        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(garbage)
            await writer.drain()

        server, url = await raw_server(peer)
        async with server:
            ws = await connect(url, headers={}, ssl_context=None, max_msg_size=128, heartbeat_s=1.0)
            try:
                while (message := await ws.receive()) is not None:
                    assert len(message) <= 128
            except ProtocolError:
                assert ws.closed
            assert ws.closed

    asyncio.run(run())


async def test_http_endpoint_bounds_and_keep_alive() -> None:
    from sentinel.agent.http import HttpServer, Response

    async def hello(query: dict[str, str]) -> Response:
        return Response(200, query.get("name", "none").encode(), "text/plain")

    http = HttpServer({("GET", "/hello"): hello})
    http.server = await asyncio.start_server(http.serve, "127.0.0.1", 0, limit=8192)
    port = http.server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            for name in ("a", "b"):  # two requests on one kept-alive connection
                async with session.get(f"http://127.0.0.1:{port}/hello?name={name}") as r:
                    assert r.status == 200 and await r.text() == name
            async with session.post(f"http://127.0.0.1:{port}/hello") as r:
                assert r.status == 405
            async with session.get(f"http://127.0.0.1:{port}/nothing") as r:
                assert r.status == 404
            async with session.post(f"http://127.0.0.1:{port}/hello", data=b"x" * 5000) as r:
                assert r.status == 413
            async with session.get(f"http://127.0.0.1:{port}/hello", headers={"X-Big": "y" * 10000}) as r:
                assert r.status == 431
            many = "&".join(f"f{i}=1" for i in range(40))
            async with session.get(f"http://127.0.0.1:{port}/hello?{many}") as r:
                assert r.status == 400
    finally:
        await http.cleanup()


async def test_mutual_tls_stream_to_the_real_aggregator(tmp_path: Path) -> None:
    """The agent's client over wss:// with this host's certificate (``stream.tls_cert_file``): acked; without
    a certificate the TLS handshake fails; the certificate's host may not claim another (close 4003)."""
    from sentinel.agent.shipper import ssl_context
    from sentinel.wire import Ack, decode_aggregator_frame, encode
    from tests.aggregator.helpers import batch, hello
    from tests.aggregator.test_identity import SHARED, make_pki, mtls_aggregator

    make_pki(tmp_path)
    async with mtls_aggregator(tmp_path) as (_, url):
        ca = str(tmp_path / "ca.pem")
        cert, key = str(tmp_path / "rack-a-01.pem"), str(tmp_path / "rack-a-01.key")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            ws = await connect(url, headers=SHARED, ssl_context=ssl_context(url, ca), max_msg_size=1 << 20)
            await ws.send_bytes(encode(hello("rack-a-01")))
            if await ws.receive() is None:
                raise ConnectionError(f"closed {ws.close_code}")
        context = ssl_context(url, ca, cert, key)
        ws = await connect(url, headers=SHARED, ssl_context=context, max_msg_size=1 << 20)
        await ws.send_bytes(encode(hello("rack-b-01")))
        assert await ws.receive() is None and ws.close_code == 4003
        ws = await connect(url, headers=SHARED, ssl_context=context, max_msg_size=1 << 20)
        await ws.send_bytes(encode(hello("rack-a-01")))
        await ws.send_bytes(encode(batch(0, time.time())))
        answer = await ws.receive()
        assert answer is not None and decode_aggregator_frame(answer) == Ack(seq=0)
        await ws.close()

"""The agents' WebSocket after the upgrade (sentinel.aggregator.wsconn): the frame decoder fuzzed, the
protocol rules it enforces, and the stream served on real sockets by it (stdlib loop and uvloop)."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.aggregator.wsconn import (
    CLOSE_PROTOCOL,
    CLOSE_TOO_BIG,
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameError,
    FrameReader,
    accept_key,
    unmask,
)
from sentinel.wire import Ack, decode_aggregator_frame, encode
from tests.aggregator.helpers import TOKEN, agent, batch, hello, running_aggregator, wait_until


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, key: bytes = b"\x01\x02\x03\x04") -> bytes:
    """A masked client frame, the masking done byte by byte (independent of the code under test)."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        head = bytes((first, 0x80 | n))
    elif n < 65536:
        head = bytes((first, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def feed_in_chunks(reader: FrameReader, data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    last = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        out += reader.feed(data[last:cut])
        last = max(last, cut)
    return out


messages = st.lists(
    st.tuples(
        st.sampled_from([OP_BINARY, OP_TEXT, OP_PING]),
        st.binary(max_size=300),
        st.integers(min_value=1, max_value=4),  # fragments (data messages only)
        st.binary(min_size=4, max_size=4),  # masking key
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(messages, st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_decoder_returns_every_message_in_order_however_the_bytes_are_split(
    sent: list[tuple[int, bytes, int, bytes]], cuts: list[int]
) -> None:
    wire = b""
    expected: list[tuple[int, bytes]] = []
    for opcode, payload, parts, key in sent:
        if opcode == OP_PING:
            payload = payload[:125]
            wire += client_frame(opcode, payload, key=key)
        else:
            size = -(-len(payload) // parts) or 1
            pieces = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
            for index, piece in enumerate(pieces):
                wire += client_frame(
                    opcode if index == 0 else OP_CONTINUATION,
                    piece,
                    fin=index == len(pieces) - 1,
                    key=key,
                )
        expected.append((opcode, payload))
    assert feed_in_chunks(FrameReader(1 << 20), wire, cuts) == expected


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(min_value=0, max_value=700), max_size=6))
def test_arbitrary_bytes_give_messages_or_a_frame_error_and_stay_bounded(
    data: bytes, cuts: list[int]
) -> None:
    reader = FrameReader(256)
    try:
        for opcode, payload in feed_in_chunks(reader, data, cuts):
            assert opcode in (OP_BINARY, OP_TEXT, OP_PING, OP_PONG, OP_CLOSE)
            assert len(payload) <= 256
    except FrameError as exc:
        assert exc.code in (CLOSE_PROTOCOL, CLOSE_TOO_BIG)
    # never more buffered than one frame's header and one bounded message
    assert len(reader.buffer) <= 14 + 256 and reader.parts_size <= 256


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.binary(min_size=4, max_size=4))
def test_unmask_is_the_bytewise_xor(payload: bytes, key: bytes) -> None:
    assert unmask(payload, key) == bytes(b ^ key[i % 4] for i, b in enumerate(payload))


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (bytes((0x82, 0x05)) + b"hello", CLOSE_PROTOCOL),  # not masked
        (bytes((0xC2, 0x80)) + b"\0\0\0\0", CLOSE_PROTOCOL),  # RSV1: no extension negotiated
        (bytes((0x83, 0x80)) + b"\0\0\0\0", CLOSE_PROTOCOL),  # reserved data opcode
        (bytes((0x8B, 0x80)) + b"\0\0\0\0", CLOSE_PROTOCOL),  # reserved control opcode
        (bytes((0x80, 0x80)) + b"\0\0\0\0", CLOSE_PROTOCOL),  # continuation with nothing to continue
        (bytes((0x09, 0x80)) + b"\0\0\0\0", CLOSE_PROTOCOL),  # fragmented ping
        (bytes((0x89, 0xFE, 0x00, 0x7E)), CLOSE_PROTOCOL),  # a 126-byte ping
        (client_frame(OP_BINARY, b"x", fin=False) + client_frame(OP_BINARY, b"y"), CLOSE_PROTOCOL),
        (bytes((0x82, 0xFF)) + (1 << 40).to_bytes(8, "big"), CLOSE_TOO_BIG),  # refused from the header
        (
            client_frame(OP_BINARY, b"a" * 200, fin=False) + client_frame(OP_CONTINUATION, b"b" * 100),
            CLOSE_TOO_BIG,
        ),
    ],
)
def test_protocol_violations_are_refused_with_their_close_code(wire: bytes, code: int) -> None:
    with pytest.raises(FrameError) as info:
        FrameReader(256).feed(wire)
    assert info.value.code == code


def test_accept_key_is_rfc6455s_example_and_refuses_bad_keys() -> None:
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert accept_key("not base64!") is None
    assert accept_key(base64.b64encode(b"short").decode()) is None


# -- on real sockets -----------------------------------------------------------------------------------


async def _raw_stream(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A hand-made upgrade, so the test can send frames aiohttp's client never would."""
    host, port = url.split("//")[1].split("/", maxsplit=1)[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /api/v1/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101 ") and f"Sec-WebSocket-Accept: {accept_key(key)}".encode() in head
    return reader, writer


async def _server_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first, second = await asyncio.wait_for(reader.readexactly(2), 5)
    assert not second & 0x80  # server frames are never masked
    n = second & 0x7F
    if n == 126:
        n = int.from_bytes(await reader.readexactly(2), "big")
    elif n == 127:
        n = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await reader.readexactly(n)


async def test_pings_are_answered_and_fragmented_messages_are_served(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running:
        reader, writer = await _raw_stream(running.stream_url)
        try:
            writer.write(client_frame(OP_PING, b"are you there"))
            assert await _server_frame(reader) == (OP_PONG, b"are you there")
            data = encode(hello("frag-host"))
            writer.write(client_frame(OP_BINARY, data[:10], fin=False))
            writer.write(client_frame(OP_PING, b"between fragments"))  # control frames may interleave
            writer.write(client_frame(OP_CONTINUATION, data[10:]))
            assert await _server_frame(reader) == (OP_PONG, b"between fragments")
            writer.write(client_frame(OP_BINARY, encode(batch(0, time.time())), key=os.urandom(4)))
            opcode, payload = await _server_frame(reader)
            assert opcode == OP_BINARY and decode_aggregator_frame(payload) == Ack(seq=0)
            writer.write(client_frame(OP_CLOSE, (1000).to_bytes(2, "big")))
            assert await _server_frame(reader) == (OP_CLOSE, (1000).to_bytes(2, "big"))  # echoed
            await wait_until(lambda: "frag-host" not in running.aggregator.by_host)
        finally:
            writer.close()


async def test_an_unmasked_frame_closes_only_that_stream_with_1002(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "good-host") as good:
        reader, writer = await _raw_stream(running.stream_url)
        try:
            writer.write(bytes((0x82, 0x03)) + b"abc")
            opcode, payload = await _server_frame(reader)
            assert opcode == OP_CLOSE and int.from_bytes(payload[:2], "big") == CLOSE_PROTOCOL
        finally:
            writer.close()
        await good.send(batch(0, time.time()))
        assert await good.ack() == 0
        value = running.aggregator.metrics.registry.get_sample_value(
            "sentinel_ingest_rejected_total", {"cluster": "default", "reason": "protocol"}
        )
        assert value == 1
        await wait_until(lambda: len(running.aggregator.connections) == 1)


async def test_an_upgrade_without_a_valid_key_or_version_is_refused(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, aiohttp.ClientSession() as session:
        base = {"Upgrade": "websocket", "Connection": "Upgrade", "Authorization": f"Bearer {TOKEN}"}
        for extra, status in (
            ({"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "bad"}, 400),
            ({"Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, 426),
        ):
            async with session.get(running.url + "/api/v1/stream", headers={**base, **extra}) as response:
                assert response.status == status
        assert running.aggregator.connections == set()


def test_the_stream_is_served_the_same_on_uvloop(tmp_path: Path) -> None:
    """The daemon runs on uvloop when installed (sentinel.aggregator.loop): its transports are not
    asyncio.Transport subclasses, and the upgrade swaps their protocol."""
    pytest.importorskip("uvloop")
    from sentinel.aggregator.loop import run

    async def main() -> None:
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        async with running_aggregator(tmp_path) as running, agent(running, "uv-host") as conn:
            for seq in range(3):
                await conn.send(batch(seq, time.time()))
                assert await conn.ack() == seq
            assert "uv-host" in running.aggregator.by_host

    run(main(), "uvloop")

"""The agents' WebSocket after the upgrade (sentinel.aggregator.wsconn): the frame decoder fuzzed, the
protocol rules it enforces, and the stream served on real sockets by it (stdlib loop and uvloop)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.aggregator import wsconn
from sentinel.aggregator.stream import Connection
from sentinel.aggregator.wsconn import MAX_FRAGMENTS, FrameError, FrameReader, accept_key, unmask
from sentinel.config.aggregator import AggregatorConfig, LimitsConfig
from sentinel.rfc6455 import (
    CLOSE_INVALID_DATA,
    CLOSE_NORMAL,
    CLOSE_PROTOCOL,
    CLOSE_TOO_BIG,
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    xor_mask,
)
from sentinel.wire import Ack, Command, SnapshotRequest, decode_aggregator_frame, encode
from tests.aggregator.helpers import TOKEN, Running, agent, batch, hello, running_aggregator, wait_until


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
    """Both ways of unmasking (aiohttp's compiled loop where it has one, the big-integer XOR otherwise)."""
    expected = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    assert unmask(payload, key) == expected
    assert xor_mask(payload, key) == expected


def test_unmask_uses_the_compiled_loop_of_the_installed_aiohttp() -> None:
    """The aiohttp this sentinel is installed with has the compiled loop (the pure integer XOR costs a
    4 kB batch ~11 µs, a tenth of the aggregator's whole per-batch budget)."""
    assert wsconn._MASK_IN_PLACE is not None


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


# -- bounds on every way a connection ends --------------------------------------------------------------


def test_a_message_in_endless_empty_fragments_is_refused() -> None:
    """Empty continuations add nothing to a message's size: without a count they would grow its list for
    ever (and never reset the idle watchdog: only whole messages do)."""
    reader = FrameReader(1 << 20)
    assert reader.feed(client_frame(OP_BINARY, b"x", fin=False)) == []
    empty = client_frame(OP_CONTINUATION, b"", fin=False)
    with pytest.raises(FrameError) as info:
        for _ in range(MAX_FRAGMENTS + 1):
            reader.feed(empty)
    assert info.value.code == CLOSE_PROTOCOL and len(reader.parts) == MAX_FRAGMENTS
    whole = FrameReader(1 << 20)  # as many fragments as allowed still make a message
    wire = client_frame(OP_BINARY, b"a", fin=False) + empty * (MAX_FRAGMENTS - 2)
    assert whole.feed(wire + client_frame(OP_CONTINUATION, b"z")) == [(OP_BINARY, b"az")]


@pytest.mark.parametrize(
    ("payload", "answer"),
    [
        (b"", CLOSE_NORMAL),
        ((1000).to_bytes(2, "big") + b"bye", CLOSE_NORMAL),
        ((4000).to_bytes(2, "big"), 4000),  # application codes are echoed
        ((1005).to_bytes(2, "big"), CLOSE_PROTOCOL),  # "no status": never sent in a frame
        ((1006).to_bytes(2, "big"), CLOSE_PROTOCOL),
        ((1015).to_bytes(2, "big"), CLOSE_PROTOCOL),
        ((2999).to_bytes(2, "big"), CLOSE_PROTOCOL),  # unassigned
        ((999).to_bytes(2, "big"), CLOSE_PROTOCOL),
        (b"\x03", CLOSE_PROTOCOL),  # a one-byte close payload
        ((1000).to_bytes(2, "big") + b"\xff\xfe", CLOSE_INVALID_DATA),  # reason not UTF-8
    ],
)
async def test_a_peers_close_is_answered_with_a_code_that_may_be_sent(
    tmp_path: Path, payload: bytes, answer: int
) -> None:
    async with running_aggregator(tmp_path) as running:
        reader, writer = await _raw_stream(running.stream_url)
        try:
            writer.write(client_frame(OP_CLOSE, payload))
            opcode, got = await _server_frame(reader)
            assert opcode == OP_CLOSE and int.from_bytes(got[:2], "big") == answer
            assert await asyncio.wait_for(reader.read(), 5) == b""  # and the server closes the socket
        finally:
            writer.close()
        await wait_until(lambda: _released(running))


async def test_a_ping_flood_is_answered_once_per_read_and_does_not_hold_off_the_idle_watchdog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wsconn, "CLOSE_WAIT_S", 0.2)
    config = AggregatorConfig(limits=LimitsConfig(hello_timeout_s=5.0, idle_timeout_s=0.5))
    async with running_aggregator(tmp_path, config) as running:
        reader, writer = await _raw_stream(running.stream_url)
        try:
            writer.write(client_frame(OP_BINARY, encode(hello("ping-host"))))
            pings = [f"ping {i}".encode() for i in range(2000)]
            writer.write(b"".join(client_frame(OP_PING, p) for p in pings))  # 26 kB in one write
            writer.write(client_frame(OP_BINARY, encode(batch(0, time.time()))))
            pongs: list[bytes] = []
            acks: list[object] = []
            while not (acks and pongs and pongs[-1] == pings[-1]):
                opcode, got = await _server_frame(reader)
                if opcode == OP_PONG:
                    pongs.append(got)
                elif isinstance(frame := decode_aggregator_frame(got), Ack):  # (a verdict push may come too)
                    acks.append(frame)
            assert acks == [Ack(seq=0)]
            # the last ping is answered; earlier ones only where a read ended with them (a few at most)
            assert pongs[-1] == pings[-1] and len(pongs) < 50 and set(pongs) <= set(pings)
            started = time.monotonic()
            # pings (and never-ending fragments) keep coming, but only whole messages count as activity
            writer.write(client_frame(OP_BINARY, b"x", fin=False))
            while running.aggregator.connections and time.monotonic() - started < 10:
                writer.write(
                    client_frame(OP_PING, b"still here") + client_frame(OP_CONTINUATION, b"", fin=False)
                )
                await asyncio.sleep(0.05)
            assert _released(running), "the idle watchdog never fired"
        finally:
            writer.close()
        value = running.aggregator.metrics.registry.get_sample_value(
            "sentinel_ingest_rejected_total", {"cluster": "default", "reason": "idle_timeout"}
        )
        assert value == 1


async def _stalled_reader(running: Running, host: str) -> tuple[socket.socket, Connection]:
    """A raw agent (hello sent) whose receive buffer is small and which reads nothing from now on, with
    pongs queued for it until the aggregator's own buffer holds some (the server's send buffer is made
    small too, so that takes kilobytes rather than the megabytes loopback buffers absorb)."""
    loop = asyncio.get_running_loop()
    port = int(running.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    await loop.sock_sendall(
        sock,
        f"GET /api/v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode(),
    )
    head = b""
    while not head.endswith(b"\r\n\r\n"):  # byte by byte: nothing after the 101 is read
        head += await asyncio.wait_for(loop.sock_recv(sock, 1), 5)
    assert head.startswith(b"HTTP/1.1 101 ")
    await loop.sock_sendall(sock, client_frame(OP_BINARY, encode(hello(host))))
    await wait_until(lambda: host in running.aggregator.by_host)
    conn = running.aggregator.by_host[host]
    server_sock = conn.ws.transport.get_extra_info("socket")
    server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ping = client_frame(OP_PING, b"p" * 125)
    deadline = time.monotonic() + 20
    while conn.ws.transport.get_write_buffer_size() == 0:
        assert time.monotonic() < deadline, "the aggregator never had to queue a pong"
        await loop.sock_sendall(sock, ping)
        await asyncio.sleep(0)  # one read (and one pong) per ping
    return sock, conn


def _released(running: Running) -> bool:
    """Nothing of any stream is still counted: stream slots, per-address streams, accepted sockets."""
    aggregator = running.aggregator
    return not aggregator.connections and not aggregator.streams._per_peer and not aggregator.peer_gate.open


@pytest.mark.parametrize("how", ["silent", "half_closed"])
async def test_a_peer_that_reads_nothing_is_cut_after_its_close_and_gives_its_slots_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A socket whose peer reads nothing cannot finish closing (the queued bytes never leave): it is cut
    CLOSE_WAIT_S after the close, so the idle watchdog's close (silent) or the peer's FIN (half-closed)
    really ends it. Before, it was held for as long as the peer kept the TCP connection open."""
    monkeypatch.setattr(wsconn, "CLOSE_WAIT_S", 0.2)
    config = AggregatorConfig(limits=LimitsConfig(hello_timeout_s=30.0, idle_timeout_s=1.0))
    async with running_aggregator(tmp_path, config) as running, agent(running, "good-host") as good:
        sock, conn = await _stalled_reader(running, "stalled-host")
        try:
            if how == "half_closed":
                sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 20
            seq = 0
            while conn in running.aggregator.connections:
                assert time.monotonic() < deadline, "the stalled stream was never cut"
                await good.send(batch(seq, time.time()))  # the others are served throughout
                assert await good.ack() == seq
                seq += 1
                await asyncio.sleep(0.2)
            assert conn.ws.done.done() and "stalled-host" not in running.aggregator.by_host
        finally:
            sock.close()
        assert running.aggregator.connections == {running.aggregator.by_host["good-host"]}
        assert running.aggregator.streams._per_peer == running.aggregator.peer_gate.open == {"127.0.0.1": 1}


async def test_a_peer_that_never_reads_is_cut_at_the_write_limit(tmp_path: Path) -> None:
    """What the aggregator sends an agent that reads nothing (acks, pongs, commands) is queued up to the
    write limit, then its socket is cut and counted as slow_reader: memory stays bounded."""
    config = AggregatorConfig(limits=LimitsConfig(hello_timeout_s=30.0, idle_timeout_s=30.0))
    async with running_aggregator(tmp_path, config) as running:
        sock, conn = await _stalled_reader(running, "stalled-host")
        aggregator = running.aggregator
        command = Command(id="c" * 64, request=SnapshotRequest())
        sent = 0
        try:
            while await aggregator.streams._send("stalled-host", command):
                sent += 1
                assert sent * len(encode(command)) < 2 * conn.ws.write_limit, "never cut"
        finally:
            sock.close()
        assert conn.ws.write_limit >= 1 << 20 and conn.ws.transport.get_write_buffer_size() == 0
        await wait_until(lambda: _released(running))
        value = aggregator.metrics.registry.get_sample_value(
            "sentinel_ingest_rejected_total", {"cluster": "default", "reason": "slow_reader"}
        )
        assert value == 1


async def test_shutdown_closes_every_stream_within_bounds_even_one_that_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM's path (runner.cleanup): agents are told 1001 and every socket is gone in about
    2 x CLOSE_WAIT_S, not after aiohttp's shutdown timeout (60 s) because one peer reads nothing."""
    monkeypatch.setattr(wsconn, "CLOSE_WAIT_S", 0.3)
    async with running_aggregator(tmp_path) as running, agent(running, "good-host") as good:
        sock, stalled = await _stalled_reader(running, "stalled-host")
        aggregator = running.aggregator
        try:
            started = time.monotonic()
            await running.runner.cleanup()
            took = time.monotonic() - started
            msg = await good.ws.receive(timeout=5)
            while msg.type == aiohttp.WSMsgType.BINARY:  # (the host's verdict pushback may come first)
                msg = await good.ws.receive(timeout=5)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1001  # going away
            assert stalled.ws.done.done()
        finally:
            sock.close()
        assert took < 20, f"shutdown took {took:.1f} s"
        assert _released(running) and not aggregator.by_host

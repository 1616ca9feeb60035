"""A small RFC 6455 WebSocket client over asyncio streams: what the agent's stream needs, nothing more.

Binary messages out (masked, as a client must), binary messages in (bounded, fragments joined), ping/pong,
the closing handshake, and a heartbeat that closes a connection whose peer stopped answering. The agent
keeps its own client rather than a general HTTP library because that library and its dependencies are most
of an idle agent's memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import struct
from urllib.parse import urlsplit

from sentinel.rfc6455 import (
    CLOSE_ABNORMAL,
    CLOSE_NORMAL,
    CLOSE_PROTOCOL,
    CLOSE_TOO_BIG,
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    accept_for,
    frame,
)

MAX_HANDSHAKE_BYTES = 16 * 1024
CLOSE_TIMEOUT_S = 5.0


class HandshakeError(Exception):
    """The server answered the upgrade with something other than a valid 101 (``status`` is its code)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


class ProtocolError(Exception):
    """The server broke the framing rules (masked frame, oversized message, bad opcode)."""


class WebSocket:
    """One open connection. ``receive()`` returns the next binary message, or None once it is closed."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_msg_size: int,
        heartbeat_s: float,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.max_msg_size = max_msg_size
        self.heartbeat_s = heartbeat_s
        self.closed = False
        self.close_code: int | None = None
        self._close_sent = False
        self._receiving = False
        self._gone = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("websocket is closed")
        await self._send(OP_BINARY, data)

    async def _send(self, opcode: int, payload: bytes) -> None:
        # one write() per frame: frames from concurrent senders never interleave
        self._writer.write(frame(opcode, payload, os.urandom(4)))
        await self._writer.drain()

    async def receive(self) -> bytes | None:
        """The next binary message; text messages are skipped; None when the connection has closed."""
        while not self.closed:
            self._receiving = True
            try:
                opcode, payload = await self._message()
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                self._abort(CLOSE_ABNORMAL)
                return None
            except ProtocolError as exc:
                await self._fail(CLOSE_TOO_BIG if "too large" in str(exc) else CLOSE_PROTOCOL)
                raise
            finally:
                self._receiving = False
            if opcode == OP_BINARY:
                return payload
        return None

    async def _message(self) -> tuple[int, bytes]:
        """One data message (fragments joined); answers pings and the peer's close on the way."""
        parts: list[bytes] = []
        size = 0
        first_opcode = 0
        while True:
            fin, opcode, payload = await self._frame_with_heartbeat()
            if opcode >= OP_CLOSE:
                await self._control(opcode, payload)
                if self.closed:
                    return OP_CLOSE, b""
                continue
            if opcode == OP_CONTINUATION:
                if not parts and not first_opcode:
                    raise ProtocolError("continuation frame without a message")
            elif opcode in (OP_TEXT, OP_BINARY):
                if first_opcode:
                    raise ProtocolError("new message inside a fragmented one")
                first_opcode = opcode
            else:
                raise ProtocolError(f"unknown opcode {opcode}")
            size += len(payload)
            if size > self.max_msg_size:
                raise ProtocolError(f"message too large: more than {self.max_msg_size} bytes")
            parts.append(payload)
            if fin:
                return first_opcode, parts[0] if len(parts) == 1 else b"".join(parts)

    async def _frame_with_heartbeat(self) -> tuple[bool, int, bytes]:
        """The next frame; after ``heartbeat_s`` of silence a ping, and half that again without an answer
        closes the connection as dead. Only the wait for a frame's first bytes is timed: ``readexactly``
        takes nothing from the stream until it has them all, so a timeout never splits a frame."""
        try:
            async with asyncio.timeout(self.heartbeat_s):  # a scope, not a task a frame (as wait_for makes)
                head = await self._reader.readexactly(2)
        except TimeoutError:
            await self._send(OP_PING, b"")
            try:
                async with asyncio.timeout(self.heartbeat_s / 2):
                    head = await self._reader.readexactly(2)
            except TimeoutError:
                raise ConnectionError("no answer to a ping: connection dead") from None
        return await self._frame(head)

    async def _frame(self, head: bytes) -> tuple[bool, int, bytes]:
        fin = bool(head[0] & 0x80)
        if head[0] & 0x70:
            raise ProtocolError("reserved bits set (no extension was negotiated)")
        opcode = head[0] & 0x0F
        if head[1] & 0x80:
            raise ProtocolError("masked frame from the server")
        length = head[1] & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await self._reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self._reader.readexactly(8))
        if opcode >= OP_CLOSE and (length > 125 or not fin):
            raise ProtocolError("control frame too long or fragmented")
        if length > self.max_msg_size:
            raise ProtocolError(f"message too large: frame of {length} bytes")
        payload = await self._reader.readexactly(length) if length else b""
        return fin, opcode, payload

    async def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == OP_PING:
            await self._send(OP_PONG, payload)
        elif opcode == OP_CLOSE:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else CLOSE_NORMAL
            self.close_code = code
            if not self._close_sent:
                self._close_sent = True
                with contextlib.suppress(ConnectionError, OSError):
                    await self._send(OP_CLOSE, struct.pack("!H", code))
            self._abort(code)
        elif opcode != OP_PONG:
            raise ProtocolError(f"unknown control opcode {opcode}")

    async def _fail(self, code: int) -> None:
        if not self._close_sent and not self.closed:
            self._close_sent = True
            with contextlib.suppress(ConnectionError, OSError):
                await self._send(OP_CLOSE, struct.pack("!H", code))
        self._abort(code)

    def _abort(self, code: int) -> None:
        if self.close_code is None:
            self.close_code = code
        self.closed = True
        self._gone.set()
        self._writer.close()

    async def close(self, code: int = CLOSE_NORMAL) -> None:
        """The closing handshake: send close, wait briefly for the peer's, then drop the connection."""
        if self.closed:
            return
        if not self._close_sent:
            self._close_sent = True
            try:
                await self._send(OP_CLOSE, struct.pack("!H", code))
            except (ConnectionError, OSError):
                self._abort(CLOSE_ABNORMAL)
                return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                if self._receiving:  # the reading task will see the peer's close
                    await self._gone.wait()
                while not self.closed:
                    _, opcode, payload = await self._frame(await self._reader.readexactly(2))
                    if opcode == OP_CLOSE:
                        await self._control(opcode, payload)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError, ProtocolError):
            pass
        self._abort(code)


async def connect(
    url: str,
    *,
    headers: dict[str, str],
    ssl_context: ssl.SSLContext | None,
    max_msg_size: int,
    heartbeat_s: float = 30.0,
) -> WebSocket:
    """Open ``url`` (ws:// or wss://) and do the upgrade; the caller bounds the time it may take."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    secure = parts.scheme == "wss"
    if secure and ssl_context is None:
        ssl_context = ssl.create_default_context()
    port = parts.port or (443 if secure else 80)
    reader, writer = await asyncio.open_connection(
        parts.hostname,
        port,
        ssl=ssl_context if secure else None,
        limit=max(MAX_HANDSHAKE_BYTES, 1 << 16),
    )
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {parts.netloc.rpartition('@')[2]}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise HandshakeError(0, "handshake answer too long") from None
        except asyncio.IncompleteReadError:
            # e.g. a server that wants a client certificate refuses it after TLS 1.3's handshake
            raise ConnectionError("the server closed the connection during the upgrade") from None
        if len(head) > MAX_HANDSHAKE_BYTES:
            raise HandshakeError(0, "handshake answer too long")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
            raise HandshakeError(0, f"not an HTTP answer: {status_line[:80]!r}")
        status = int(fields[1])
        if status != 101:
            raise HandshakeError(status, f"upgrade refused: {status_line[:80]!r}")
        answer = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                answer[name.strip().lower()] = value.strip()
        expected = accept_for(key)
        if answer.get("upgrade", "").lower() != "websocket" or answer.get("sec-websocket-accept") != expected:
            raise HandshakeError(status, "invalid upgrade answer")
        if answer.get("sec-websocket-extensions"):
            raise HandshakeError(status, "the server chose an extension that was not offered")
    except BaseException:
        writer.close()
        raise
    return WebSocket(reader, writer, max_msg_size=max_msg_size, heartbeat_s=heartbeat_s)

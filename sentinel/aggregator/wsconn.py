"""The agents' WebSocket after the upgrade: RFC 6455 frames read and written straight on the transport.

aiohttp handles everything up to ``101 Switching Protocols``; from there :class:`AgentSocket` hands each
complete message to the stream's handler inside ``data_received`` and writes its ack once the state it
changed is committed (:mod:`sentinel.aggregator.acks`), avoiding aiohttp's per-message task wake-ups. The
decoder is bounded and strict (masked client frames, no extensions, size and fragment limits with the
matching close codes), and every way a connection ends is bounded in time (``CLOSE_WAIT_S``), so a peer that stops reading still frees its slot.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable

from sentinel.rfc6455 import (
    CLOSE_ABNORMAL,
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
    accept_for,
    frame,
    xor_mask,
)

#: a close frame the peer never answers: the socket is closed this long after ours went out, and aborted
#: this long after that if its queued bytes have still not been read
CLOSE_WAIT_S = 2.0
#: most frames one message may come in (aiohttp's client sends each message in one)
MAX_FRAGMENTS = 1024
_ZERO_MASK = b"\x00\x00\x00\x00"


class FrameError(Exception):
    """The peer broke the protocol: close with ``code`` (1002, 1009) saying ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def accept_key(key: str) -> str | None:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (None: not a valid key, 16 bytes base64)."""
    try:
        raw = base64.b64decode(key.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    if len(raw) != 16:
        return None
    return accept_for(key.strip())


def _compiled_mask() -> Callable[[bytes, bytearray], None] | None:
    """aiohttp's compiled in-place WebSocket XOR, when the installed aiohttp has one (None: it has not)."""
    try:
        from aiohttp._websocket.mask import _websocket_mask_cython  # type: ignore[import-not-found]
    except ImportError:
        return None
    mask: Callable[[bytes, bytearray], None] = _websocket_mask_cython
    return mask


_MASK_IN_PLACE = _compiled_mask()


def unmask(payload: bytes, key: bytes) -> bytes:
    """XOR ``payload`` with the 4-byte masking ``key``: aiohttp's compiled loop when it has one (an order of
    magnitude cheaper per batch: docs/performance.md), else :func:`~sentinel.rfc6455.xor_mask`."""
    if not payload or key == _ZERO_MASK:
        return payload
    if _MASK_IN_PLACE is None:
        return xor_mask(payload, key)
    data = bytearray(payload)
    _MASK_IN_PLACE(key, data)
    return bytes(data)


def close_payload(code: int, message: bytes = b"") -> bytes:
    return code.to_bytes(2, "big") + message[:123]


def sendable_close_code(code: int) -> bool:
    """A code a close frame may carry (RFC 6455 7.4): 1004-1006 and 1015 are reserved, 1016-2999 unassigned."""
    return (1000 <= code <= 1014 and code not in (1004, 1005, 1006)) or 3000 <= code <= 4999


class FrameReader:
    """Incremental decoder of client frames into whole messages ``(opcode, payload)``.

    Buffers at most one frame header and what has arrived of one message (bounded by ``max_message``):
    a frame announcing more than the bound is refused from its header alone.
    """

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message if max_message > 0 else 1 << 62
        self.buffer = bytearray()
        self.parts: list[bytes] = []  # a fragmented message so far
        self.parts_opcode = 0
        self.parts_size = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The messages completed by ``data``; raises :class:`FrameError` on the first violation.

        With nothing buffered (an agent's batch comes in one read) the frames are read from ``data`` itself
        and only an incomplete tail is copied into the buffer."""
        buf: bytes | bytearray
        if self.buffer:
            buf = self.buffer
            buf += data
        else:
            buf = data
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            first, second = buf[pos], buf[pos + 1]
            fin = first & 0x80
            opcode = first & 0x0F
            if first & 0x70:
                raise FrameError(CLOSE_PROTOCOL, "reserved bits set (no extension was negotiated)")
            if not second & 0x80:
                raise FrameError(CLOSE_PROTOCOL, "client frames must be masked")
            length = second & 0x7F
            head = pos + 2
            if length == 126:
                if end - head < 2:
                    break
                length = int.from_bytes(buf[head : head + 2], "big")
                head += 2
            elif length == 127:
                if end - head < 8:
                    break
                length = int.from_bytes(buf[head : head + 8], "big")
                head += 8
                if length >> 63:
                    raise FrameError(CLOSE_PROTOCOL, "frame length over 2**63")
            if opcode >= OP_CLOSE:
                if opcode > OP_PONG:
                    raise FrameError(CLOSE_PROTOCOL, f"unknown control opcode {opcode}")
                if not fin or length > 125:
                    raise FrameError(CLOSE_PROTOCOL, "control frames must be whole and at most 125 bytes")
            else:
                if opcode > OP_BINARY:
                    raise FrameError(CLOSE_PROTOCOL, f"unknown data opcode {opcode}")
                if opcode == OP_CONTINUATION and not self.parts_opcode:
                    raise FrameError(CLOSE_PROTOCOL, "continuation frame without a message to continue")
                if opcode != OP_CONTINUATION and self.parts_opcode:
                    raise FrameError(CLOSE_PROTOCOL, "a new message began inside a fragmented one")
                if not fin and len(self.parts) >= MAX_FRAGMENTS:
                    raise FrameError(CLOSE_PROTOCOL, f"a message in more than {MAX_FRAGMENTS} fragments")
                if self.parts_size + length > self.max_message:
                    raise FrameError(
                        CLOSE_TOO_BIG,
                        f"message of {self.parts_size + length} bytes or more exceeds {self.max_message}",
                    )
            if end - head < 4 + length:
                break
            key = bytes(buf[head : head + 4])
            payload = unmask(bytes(buf[head + 4 : head + 4 + length]), key)
            pos = head + 4 + length
            if opcode >= OP_CLOSE or (fin and opcode != OP_CONTINUATION):
                out.append((opcode, payload))
            else:
                if opcode != OP_CONTINUATION:
                    self.parts_opcode = opcode
                self.parts.append(payload)
                self.parts_size += length
                if fin:
                    out.append((self.parts_opcode, b"".join(self.parts)))
                    self.parts, self.parts_opcode, self.parts_size = [], 0, 0
        if buf is self.buffer:
            if pos:
                del self.buffer[:pos]
        elif pos < end:
            self.buffer += buf[pos:]
        return out


#: what the stream's handler is given: each whole text or binary message, in order
OnMessage = Callable[[int, bytes], None]
#: the peer broke the protocol (code, reason) or ended the connection (code 1006, reason "")
OnProblem = Callable[[int, str], None]


class AgentSocket(asyncio.Protocol):
    """The protocol of an upgraded agent connection (installed with ``transport.set_protocol``).

    ``previous`` is the protocol it replaced (aiohttp's request handler, or the listener's
    :class:`~sentinel.aggregator.listener.GatedProtocol` in front of it): it is told when the connection is
    lost, so the per-address count is released and aiohttp finishes its request. Writes never wait; a peer
    that stops reading until ``write_limit`` bytes are queued for it is cut off.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        previous: asyncio.BaseProtocol,
        *,
        max_message: int,
        write_limit: int,
        on_message: OnMessage,
        on_problem: OnProblem,
    ) -> None:
        self.transport = transport
        self.previous = previous
        self.reader = FrameReader(max_message)
        self.write_limit = write_limit
        self.on_message = on_message
        self.on_problem = on_problem
        self.failed = False  # the peer broke the framing
        self.closed = False  # a close frame went out, or the connection is gone: nothing more is sent
        self.close_code: int | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._close_timer: asyncio.TimerHandle | None = None

    # -- transport events -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.done.done() or self.failed:
            return  # after a protocol error nothing more can be framed: dropped until the socket closes
        try:
            messages = self.reader.feed(data)
        except FrameError as exc:
            self.failed = True
            self.on_problem(exc.code, exc.reason)
            self.close(exc.code, exc.reason.encode()[:120])
            return
        ping: bytes | None = None  # the last ping's payload: answered once, after what came before it
        for opcode, payload in messages:
            if opcode in (OP_BINARY, OP_TEXT):
                if not self.closed:  # after our close frame, data is read and dropped until theirs
                    self.on_message(opcode, payload)
            elif opcode == OP_PING:
                ping = payload
            elif opcode == OP_CLOSE:
                self._pong(ping)
                self._peer_closed(payload)
                return
        self._pong(ping)

    def _pong(self, ping: bytes | None) -> None:
        if ping is not None and not self.closed:
            self._write(frame(OP_PONG, ping))

    def _peer_closed(self, payload: bytes) -> None:
        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else CLOSE_NORMAL
        if not self.closed:  # theirs came first: answer it, then the connection ends
            self.closed = True
            self.close_code = code
            self._write(frame(OP_CLOSE, close_payload(_close_answer(payload))))
        self._finish()

    def _finish(self) -> None:
        """Close the socket once what is queued for it is written; a peer that has not read that within
        ``CLOSE_WAIT_S`` is cut (a plain close would wait for it for ever, holding the stream's slot)."""
        if self.done.done():
            return
        if self._close_timer is not None:
            self._close_timer.cancel()
        self.transport.close()
        self._close_timer = asyncio.get_running_loop().call_later(CLOSE_WAIT_S, self.transport.abort)

    def eof_received(self) -> bool | None:
        """The peer sent its FIN: our side closes too, bounded like any other end (a peer that half-closes
        and then reads nothing would otherwise hold the socket while our queued bytes wait)."""
        self._finish()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        was_closed = self.closed
        self.closed = True
        if self.close_code is None:
            self.close_code = CLOSE_ABNORMAL
        try:
            if not was_closed:
                self.on_problem(CLOSE_ABNORMAL, "")
        finally:
            if not self.done.done():
                self.done.set_result(None)
            self.previous.connection_lost(exc)

    def pause_writing(self) -> None:
        """Writes never wait (the queued bytes are bounded by ``write_limit`` instead)."""

    def resume_writing(self) -> None:
        """See :meth:`pause_writing`."""

    # -- sending --------------------------------------------------------------------------------------

    def send(self, payload: bytes) -> None:
        """One binary message; raises ConnectionResetError once the socket is closing."""
        if self.closed:
            raise ConnectionResetError("the agent's connection is closing")
        self._write(frame(OP_BINARY, payload))

    def _write(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > self.write_limit:
            self.closed = True
            self.close_code = CLOSE_ABNORMAL
            self.on_problem(CLOSE_ABNORMAL, f"over {self.write_limit} bytes queued: the agent reads nothing")
            self.transport.abort()

    def close(self, code: int = CLOSE_NORMAL, message: bytes = b"") -> None:
        """Send a close frame; the socket closes when the agent answers, or after ``CLOSE_WAIT_S`` (and is
        cut ``CLOSE_WAIT_S`` after that if the agent reads nothing)."""
        if self.closed:
            return
        self._write(frame(OP_CLOSE, close_payload(code, message)))
        self.closed = True
        self.close_code = code
        if not self.transport.is_closing():
            self._close_timer = asyncio.get_running_loop().call_later(CLOSE_WAIT_S, self._finish)


def _close_answer(payload: bytes) -> int:
    """The code our answer to a peer's close frame carries: theirs when it is one that may be sent (RFC 6455
    5.5.1, 7.4), 1000 for a close without a code, 1002 for a one-byte payload or a reserved code, 1007 for a
    reason that is not UTF-8."""
    if not payload:
        return CLOSE_NORMAL
    code = int.from_bytes(payload[:2], "big")
    if len(payload) == 1 or not sendable_close_code(code):
        return CLOSE_PROTOCOL
    try:
        payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        return CLOSE_INVALID_DATA
    return code


def handshake_response(accept: str) -> bytes:
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
    ).encode("ascii")

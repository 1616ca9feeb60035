"""The local socket on which training processes hand over their flight-recorder heads.

A unix ``SOCK_DGRAM`` socket: one msgpack-encoded :class:`sentinel.fr.heads.FrHeads` per datagram, so a
training process never blocks on the agent (a full socket buffer drops the datagram on the sender's side,
which ``sentinel.probe`` counts) and never has to manage a connection. Datagrams are size-bounded and
validated; anything else is counted and dropped. The agent fills in ``host`` and ``gpu`` from its
process → GPU mapping before forwarding.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import stat
from collections import deque
from pathlib import Path

import msgspec

from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger

log = get_logger(module="agent.probe")

_decoder = msgspec.msgpack.Decoder(FrHeads)


class ProbeError(ValueError):
    """A datagram that is not a valid FrHeads."""


def decode_heads(data: bytes, max_bytes: int) -> FrHeads:
    """Validate one datagram; raise :class:`ProbeError` naming what is wrong."""
    if len(data) > max_bytes:
        raise ProbeError(f"datagram of {len(data)} bytes exceeds {max_bytes}")
    try:
        heads = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProbeError(f"not an FrHeads: {exc}") from None
    if not math.isfinite(heads.t) or heads.rank < 0 or len(heads.pgs) > 4096:
        raise ProbeError("FrHeads out of range (t not finite, negative rank or too many groups)")
    return heads


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, server: ProbeServer) -> None:
        self.server = server

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.server.receive(data)

    def error_received(self, exc: Exception) -> None:
        log.warning("probe_socket_error", error=str(exc))


class ProbeServer:
    """Receives FrHeads datagrams into a bounded queue drained once per tick."""

    def __init__(
        self, path: str, *, max_bytes: int = 65536, max_pending: int = 4096, mode: int = 0o666
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.mode = mode
        self._pending: deque[FrHeads] = deque(maxlen=max_pending)
        self._transport: asyncio.DatagramTransport | None = None
        self.received = 0
        self.rejected = 0
        self.overflowed = 0

    def __len__(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # left over from a previous run
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sock.bind(self.path)
        os.chmod(self.path, self.mode)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
        self._transport = transport

    def receive(self, data: bytes) -> None:
        try:
            heads = decode_heads(data, self.max_bytes)
        except ProbeError as exc:
            self.rejected += 1
            if self.rejected <= 10 or self.rejected % 1000 == 0:
                log.warning(
                    "probe_datagram_rejected", socket=self.path, problem=str(exc), rejected=self.rejected
                )
            return
        if len(self._pending) == self._pending.maxlen:
            self.overflowed += 1
        self._pending.append(heads)
        self.received += 1

    def drain(self) -> list[FrHeads]:
        out = list(self._pending)
        self._pending.clear()
        return out

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

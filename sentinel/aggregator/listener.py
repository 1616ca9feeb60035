"""The aggregator's TCP listener: concurrent connections per peer address are limited at accept.

The stream handler already bounds agent *streams* per address, but only after a full HTTP request and the
WebSocket upgrade. Sockets that connect and send nothing never get there: from one address they would hold
file descriptors (and, once upgraded without a Hello, stream slots) until their timeouts. Here every
accepted TCP connection is counted against its peer's IP address before a single byte is read; one over
``limits.max_connections_per_peer`` is closed at once and counted as ``peer_connection_limit`` in
``sentinel_ingest_rejected_total`` (logged through :class:`~sentinel.aggregator.refusals.RefusalLog`).

TLS is done here too, after the count (``loop.start_tls``), so a flood of sockets that never finish a
handshake is bounded the same way and each handshake is bounded in time by ``limits.header_timeout_s``. A
handshake that fails — a client certificate from a CA the aggregator does not trust, none where mutual TLS
needs one, a timeout — is handed to ``on_tls_failed`` with the peer's address and the reason (the
aggregator counts it as ``tls_handshake`` in ``sentinel_ingest_rejected_total`` and logs it).
:class:`AggregatorSite` is a drop-in for ``aiohttp.web.TCPSite`` that listens this way.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from aiohttp import web


class PeerGate:
    """Open TCP connections per peer IP address; admission beyond the limit is refused."""

    def __init__(
        self,
        limit: Callable[[], int],
        on_refused: Callable[[str, int], None],
        handshake_timeout_s: float = 10.0,
        on_tls_failed: Callable[[str, str], None] | None = None,
    ) -> None:
        self.limit = limit
        self.on_refused = on_refused
        self.on_tls_failed = on_tls_failed
        self.handshake_timeout_s = handshake_timeout_s  # a TLS handshake must be done within this long
        self.open: dict[str, int] = {}

    def admit(self, ip: str) -> bool:
        count = self.open.get(ip, 0)
        limit = self.limit()
        if count >= limit:
            self.on_refused(ip, limit)
            return False
        self.open[ip] = count + 1
        return True

    def release(self, ip: str) -> None:
        left = self.open.get(ip, 1) - 1
        if left > 0:
            self.open[ip] = left
        else:
            self.open.pop(ip, None)


def _peer_ip(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer) if peer else "?"


class GatedProtocol(asyncio.Protocol):
    """Stands in front of aiohttp's request handler: counts the connection, then passes everything on.

    Data that arrives between the end of a TLS handshake and the handler taking the connection is held and
    handed over in order.
    """

    def __init__(
        self,
        gate: PeerGate,
        make_handler: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.gate = gate
        self.make_handler = make_handler
        self.ssl_context = ssl_context
        self.inner: asyncio.Protocol | None = None
        self.ip: str | None = None  # set once admitted (and released exactly once)
        self.held: list[bytes] = []
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ip = _peer_ip(transport)
        if not self.gate.admit(ip):
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # no FIN dance, no buffer: the fd is freed now
            else:
                transport.close()
            return
        self.ip = ip
        if self.ssl_context is None:
            self._hand_over(transport)
        else:
            asyncio.get_running_loop().create_task(self._start_tls(transport, self.ssl_context))

    async def _start_tls(self, transport: asyncio.BaseTransport, context: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport,  # type: ignore[arg-type]
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.gate.handshake_timeout_s,
            )
        except asyncio.CancelledError:
            self._release()  # shutting down
            return
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            if self.gate.on_tls_failed is not None and self.ip is not None:
                self.gate.on_tls_failed(self.ip, _handshake_failure(exc))
            self._release()  # the handshake failed or timed out: asyncio closed the socket
            return
        if tls is None or self.lost:
            self._release()
            return
        self._hand_over(tls)

    def _hand_over(self, transport: asyncio.BaseTransport) -> None:
        inner = self.make_handler()
        self.inner = inner
        inner.connection_made(transport)
        held, self.held = self.held, []
        for data in held:
            inner.data_received(data)
        if self.eof:
            inner.eof_received()

    def _release(self) -> None:
        if self.ip is not None:
            self.gate.release(self.ip)
            self.ip = None

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        else:
            self.held.append(data)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        self.eof = True
        return None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._release()
        if self.inner is not None:
            self.inner.connection_lost(exc)


def _handshake_failure(exc: BaseException) -> str:
    """Why a TLS handshake failed, in one line (the SSL library's reason when it gives one)."""
    if isinstance(exc, TimeoutError):
        return "handshake not done in time"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return " ".join(f"client certificate not trusted: {exc.verify_message or exc.reason}".split())[:200]
    if isinstance(exc, ssl.SSLError):
        return " ".join(str(exc.reason or exc).split())[:200]
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]


class AggregatorSite(web.TCPSite):
    """``web.TCPSite`` for the aggregator's app (``app[PEER_GATE_KEY]``): TCP connections limited per peer
    address at accept, TLS (``ssl_context``) after that."""

    __slots__ = ()

    async def start(self) -> None:
        await web.BaseSite.start(self)
        runner = self._runner
        assert isinstance(runner, web.AppRunner)
        server = runner.server
        assert server is not None
        gate = runner.app[PEER_GATE_KEY]
        context = self._ssl_context

        def factory() -> GatedProtocol:
            return GatedProtocol(gate, server, context)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


PEER_GATE_KEY: web.AppKey[PeerGate] = web.AppKey("sentinel_peer_gate", PeerGate)

"""The agents' stream: the WebSocket upgrade, hello / batch / ack, command answers, per-connection bounds.

Ingest is strict and isolated per connection: the bearer token is compared in constant time before the
upgrade (401), the connection count is bounded (503), every frame is validated by the shared wire schema,
and a bad frame closes *that* connection with a close code saying why — 1007 malformed, 1008 protocol or
limit violation, 1009 over ``limits.max_frame_bytes``, 1002 broken WebSocket framing, 1003 text instead of
binary — with one log line; the other agents never notice. aiohttp serves the HTTP side up to the upgrade;
the upgraded stream is read and written by :mod:`sentinel.aggregator.wsconn`, each message handled where it
was read. Batches are acked once what they changed is committed (:mod:`.acks`); a resend of an applied seq
is acked and dropped (at-least-once delivery, exactly-once effect). Commands go out on the same streams, and
only the connection a command went to may answer it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from aiohttp import WSCloseCode, web

from sentinel.aggregator.acks import DurableAcks
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.identity import HOST_NAME, TokenBook, TokenGrant, certificate_names
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.aggregator.pushback import VerdictPush
from sentinel.aggregator.refusals import RefusalLog
from sentinel.aggregator.state import HostView
from sentinel.aggregator.wsconn import AgentSocket, accept_key, handshake_response
from sentinel.config.aggregator import AggregatorConfig, LimitsConfig
from sentinel.log import get_logger
from sentinel.rfc6455 import CLOSE_PROTOCOL, OP_BINARY
from sentinel.wire import Batch, Command, CommandResult, Hello, decode_agent_frame, encode


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.stream")


CLOSE_UNSUPPORTED = 1003
CLOSE_MALFORMED = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_REPLACED = 4000
CLOSE_HOST_NOT_ALLOWED = 4003  # the token (or client certificate) may not speak for the host it claimed


class Connection:
    """One agent's stream."""

    def __init__(
        self,
        ws: AgentSocket,
        peer: str,
        grants: Sequence[TokenGrant] = (),
        cert_names: tuple[str, ...] | None = None,
    ) -> None:
        self.ws = ws
        self.peer = peer
        self.grants = tuple(grants)  # what the bearer token may speak for
        self.cert_names = cert_names  # None: the host is not bound to a client certificate
        self.host: str | None = None
        self.view: HostView | None = None  # the host's state, from its hello on
        #: loop time of the latest frame; the idle watchdog (one timer per connection, re-armed when it
        #: fires) closes a stream silent past its timeout. A timer per received frame cost ~5% of the
        #: aggregator's core at 6,144 hosts (asyncio timer handles and their heap).
        self.last_frame_at = 0.0
        self.watchdog: asyncio.TimerHandle | None = None

    def may_speak_for(self, host: str) -> bool:
        if self.cert_names is not None and host not in self.cert_names:
            return False
        return any(grant.allows(host) for grant in self.grants)


class AgentStreams:
    """Every agent's stream: connections by host, commands in flight, and the handling of each frame."""

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        engine: Engine,
        tokens: TokenBook,
        metrics: AggregatorMetrics,
        refusals: RefusalLog,
        pushback: VerdictPush,
        clock: Callable[[], float],
    ) -> None:
        self.config = config  # replaced on reload (server and limits stay)
        self.engine = engine
        self.tokens = tokens
        self.metrics = metrics
        self.refusals = refusals
        self.pushback = pushback
        self.clock = clock
        self.connections: set[Connection] = set()
        self.by_host: dict[str, Connection] = {}
        #: command id → (the connection it went to, its answer); only that connection may answer it
        self.pending: dict[str, tuple[Connection, asyncio.Future[CommandResult]]] = {}
        self._drops_logged: dict[str, float] = {}
        self._per_peer: dict[str, int] = {}
        self._warned: dict[str, tuple[float, int]] = {}
        #: acks sent once the state a batch changed is committed (the aggregator gives it its store)
        self.acks = DurableAcks(None)
        #: shutting down: agents' messages are no longer applied (nor acked)
        self.stopping = False

    def grants_for(self, header: str) -> list[TokenGrant]:
        return self.tokens.grants_for(header)

    def close_all(self) -> None:
        """Shutting down: every stream told so, every command in flight cancelled."""
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.ws.close(WSCloseCode.GOING_AWAY, b"aggregator shutting down")
        for _, future in self.pending.values():
            future.cancel()
        self.pending.clear()

    # -- commands -------------------------------------------------------------------------------------

    async def request(self, host: str, command: Command, timeout_s: float) -> CommandResult | None:
        """Send a command to ``host``'s agent and wait for its result (None: not connected / no answer)."""
        conn = self.by_host.get(host)
        if conn is None or conn.ws.closed:
            return None
        if len(self.pending) >= self.config.limits.max_pending_commands:
            self.metrics.rejected("commands_pending")
            return None
        future: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
        self.pending[command.id] = (conn, future)
        try:
            conn.ws.send(encode(command))
            return await asyncio.wait_for(future, timeout_s)
        except (TimeoutError, ConnectionError, RuntimeError):
            return None
        finally:
            self.pending.pop(command.id, None)

    async def _send(self, host: str, command: Command) -> bool:
        """Send a command without waiting for its answer; False when the host is not connected."""
        conn = self.by_host.get(host)
        if conn is None or conn.ws.closed:
            return False
        try:
            conn.ws.send(encode(command))
        except ConnectionError:
            return False
        return True

    # -- stream ---------------------------------------------------------------------------------------

    async def stream(self, request: web.Request) -> web.StreamResponse:
        peer = request.remote or "?"
        grants = self.grants_for(request.headers.get("Authorization", ""))
        if not grants:
            self.refusals.refused("unauthorized", "stream_unauthorized", peer=peer)
            raise web.HTTPUnauthorized(
                text="missing or invalid bearer token\n", headers={"WWW-Authenticate": "Bearer"}
            )
        limits = self.config.limits
        if len(self.connections) >= limits.max_connections:
            self.refusals.refused(
                "too_many_connections", "stream_refused", peer=peer, limit=limits.max_connections
            )
            raise web.HTTPServiceUnavailable(text="too many agent connections\n")
        if self._per_peer.get(peer, 0) >= limits.max_streams_per_peer:
            self.refusals.refused(
                "too_many_from_peer", "stream_refused", peer=peer, limit=limits.max_streams_per_peer
            )
            raise web.HTTPServiceUnavailable(text="too many agent connections from this address\n")
        accept = _upgrade_accept(request)
        transport = request.transport
        if transport is None or transport.is_closing():  # (uvloop's transports are no asyncio.Transport)
            raise web.HTTPBadRequest(text="connection closed before the upgrade\n")
        # No WebSocket heartbeat: dead peers are found by TCP keepalive instead; a reconnecting agent replaces
        # its old connection at once, and a silent host is a verdict of its own.
        _keepalive(request)
        # From the 101 on the connection is ours (wsconn.AgentSocket): written and swapped in one step, so
        # no frame can reach aiohttp's request handler in between.
        socket_ = AgentSocket(
            transport,
            transport.get_protocol(),
            max_message=limits.max_frame_bytes,
            write_limit=max(1 << 20, 4 * limits.max_frame_bytes),
            on_message=lambda opcode, data: self._on_message(conn, opcode, data),
            on_problem=lambda code, why: self._on_socket_problem(conn, code, why),
        )
        conn = Connection(socket_, peer, grants, self._cert_names(request))
        transport.write(handshake_response(accept))
        transport.set_protocol(socket_)
        self.connections.add(conn)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        conn.last_frame_at = asyncio.get_running_loop().time()
        self._watch(conn)
        try:
            await asyncio.shield(socket_.done)
        except asyncio.CancelledError:  # aiohttp shutting down: the agent is told so
            socket_.close(WSCloseCode.GOING_AWAY, b"aggregator shutting down")
            raise
        finally:
            if conn.watchdog is not None:
                conn.watchdog.cancel()
            self.connections.discard(conn)
            left = self._per_peer.get(peer, 1) - 1
            if left > 0:
                self._per_peer[peer] = left
            else:
                self._per_peer.pop(peer, None)
            self.acks.forget(socket_)
            if conn.host is not None and self.by_host.get(conn.host) is conn:
                del self.by_host[conn.host]
                self.engine.disconnected(conn.host)
        # the connection is gone; aiohttp finds its transport closed and writes nothing of this
        return web.Response(status=101)

    def _cert_names(self, request: web.Request) -> tuple[str, ...] | None:
        server = self.config.server
        if not (server.tls_client_ca_file and server.tls_client_cert_names_host):
            return None
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        if ssl_object is None:
            return ()  # mutual TLS configured but this connection is not TLS: it may speak for no host
        return certificate_names(ssl_object.getpeercert())

    def _close(self, conn: Connection, code: int, reason: str, why: str, **extra: str) -> None:
        fields: dict[str, Any] = {"peer": conn.peer, "host": conn.host, "code": code, "detail": why[:300]}
        fields.update(extra)
        self.refusals.refused(reason, "stream_closed", **fields)
        conn.ws.close(code, f"{reason}: {why}".encode()[:120])

    def _watch(self, conn: Connection) -> None:
        """The idle watchdog: a stream without a hello within ``hello_timeout_s`` of its last frame, or silent
        for ``idle_timeout_s`` after it, is closed saying why; otherwise wake again at that deadline."""
        limits = self.config.limits
        loop = asyncio.get_running_loop()
        limit = limits.hello_timeout_s if conn.host is None else limits.idle_timeout_s
        now = loop.time()
        deadline = conn.last_frame_at + limit
        if now >= deadline and self.acks.waiting_on(conn.ws):
            # the agent stopped at its in-flight limit waiting for acks the store has not committed yet: it
            # is not idle, and a reconnect would only resend what this stream already holds
            deadline = now + limit
        if now < deadline:
            conn.watchdog = loop.call_at(deadline, self._watch, conn)
            return
        conn.watchdog = None
        if conn.ws.closed:
            return
        if conn.view is None:
            self._close(conn, CLOSE_POLICY, "hello_timeout", f"no hello within {limits.hello_timeout_s:g}s")
        else:
            self._close(conn, CLOSE_POLICY, "idle_timeout", f"nothing sent for {limits.idle_timeout_s:g}s")

    def _on_socket_problem(self, conn: Connection, code: int, why: str) -> None:
        """The agent broke the WebSocket protocol (1002, 1009) or its connection ended without a close."""
        if code in (CLOSE_TOO_BIG, CLOSE_PROTOCOL):
            self.refusals.refused(
                "frame_too_large" if code == CLOSE_TOO_BIG else "protocol",
                "stream_closed",
                peer=conn.peer,
                host=conn.host,
                code=code,
                detail=why[:300],
            )
        elif why:  # the agent reads nothing: its socket was cut
            self.refusals.refused("slow_reader", "stream_closed", peer=conn.peer, host=conn.host, detail=why)
        else:
            log().info("stream_lost", peer=conn.peer, host=conn.host, code=code)

    def _on_message(self, conn: Connection, opcode: int, data: bytes) -> None:
        """One whole message of an agent's stream, handled where it was read (no task, no queue)."""
        if self.stopping:
            return  # not applied, not acked: the agent resends it to the next process
        conn.last_frame_at = asyncio.get_running_loop().time()
        try:
            self._frame(conn, opcode, data)
        except Exception as exc:  # whatever one connection does, the aggregator carries on
            self._ingest_error("stream_failed", conn, exc, peer=conn.peer)
            conn.ws.close(CLOSE_INTERNAL, b"internal error")

    def _ingest_error(self, event: str, conn: Connection, exc: Exception, **fields: Any) -> None:
        """A bug met on an agent's frame: counted (``ingest_error``) and logged, never raised further."""
        self.refusals.refused(
            "ingest_error",
            event,
            level="error",
            host=conn.host,
            error=f"{type(exc).__name__}: {exc}"[:300],
            **fields,
        )

    def _frame(self, conn: Connection, opcode: int, data: bytes) -> None:
        limits, engine, view = self.config.limits, self.engine, conn.view
        if opcode != OP_BINARY:
            self._close(conn, CLOSE_UNSUPPORTED, "text_frame", "frames are binary msgpack")
            return
        try:
            frame = decode_agent_frame(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._close(conn, CLOSE_MALFORMED, "malformed", str(exc))
            return
        if isinstance(frame, Batch):
            if view is None:
                self._close(conn, CLOSE_POLICY, "protocol", "batch before hello")
                return
            problem = _batch_over_limits(frame, limits)
            if problem:
                self._close(conn, CLOSE_POLICY, "batch_too_large", f"seq {frame.seq}: {problem}")
                return
            try:
                skewed = engine.fleet.future_stamped
                fresh = engine.ingest(view, frame, self.clock())
                if engine.fleet.future_stamped != skewed:
                    self._warn_limited(
                        "clock_skew",
                        host=view.name,
                        ignored=engine.fleet.future_stamped - skewed,
                        max_clock_skew_s=limits.max_clock_skew_s,
                        detail="samples/heads stamped ahead of the aggregator's clock: check the host's NTP",
                    )
                if fresh and frame.drops is not None:
                    self._log_drops(view.name, frame)
            except Exception as exc:  # never die from what an agent sends (the batch is still acked)
                self._ingest_error("ingest_failed", conn, exc, seq=frame.seq)
            self.acks.hold(conn.ws, frame.seq)  # sent once what it changed is committed
        elif isinstance(frame, Hello):
            if view is not None:
                self._close(conn, CLOSE_POLICY, "protocol", "second hello")
                return
            if not conn.may_speak_for(frame.host):
                # before anything is touched: the host's real stream and state are unaffected
                self._close(
                    conn,
                    CLOSE_HOST_NOT_ALLOWED,
                    "host_not_allowed",
                    f"the token{' or client certificate' if conn.cert_names is not None else ''} "
                    f"may not speak for host {frame.host[:80]!r}",
                    claimed=frame.host[:80],
                )
                return
            problem = self._check_hello(frame)
            if problem:
                self._close(conn, CLOSE_POLICY, "bad_hello", problem)
                return
            conn.host = frame.host
            old = self.by_host.get(frame.host)
            self.by_host[frame.host] = conn
            if old is not None and old is not conn:
                old.ws.close(CLOSE_REPLACED, b"replaced by a newer connection")
            conn.view = engine.hello(frame, self.clock())
            if conn.watchdog is not None:  # from now on the idle timeout applies
                conn.watchdog.cancel()
            self._watch(conn)
            self.pushback.mark(frame.host)
        else:  # CommandResult
            self._answer(conn, frame)

    def _host_forgotten(self, host: str) -> None:
        """A forgotten host is no longer pushed its verdicts (it is not connected) nor rate-limited."""
        self.pushback.marked.discard(host)
        self._drops_logged.pop(host, None)

    def _peer_refused(self, ip: str, limit: int) -> None:
        self.refusals.refused("peer_connection_limit", "connection_refused", peer=ip, limit=limit)

    def _tls_refused(self, ip: str, detail: str) -> None:
        self.refusals.refused("tls_handshake", "tls_handshake_refused", peer=ip, detail=detail)

    def _warn_limited(self, event: str, **fields: Any) -> None:
        """A warning at most every 10 s per event, with how many were suppressed: floods cannot fill the log."""
        now = time.monotonic()
        until, suppressed = self._warned.get(event, (-math.inf, 0))
        if now < until:
            self._warned[event] = (until, suppressed + 1)
            return
        self._warned[event] = (now + 10.0, 0)
        log().warning(event, suppressed=suppressed, **fields)

    def _log_drops(self, host: str, batch: Batch) -> None:
        """An agent's reported drops (also ``sentinel_agent_reported_drops_total``): a line a minute per host."""
        now = time.monotonic()
        if batch.drops is None or now < self._drops_logged.get(host, -math.inf):
            return
        if len(self._drops_logged) > 4 * self.config.limits.max_hosts:
            self._drops_logged.clear()
        self._drops_logged[host] = now + 60.0
        log().warning(
            "agent_reported_drops", host=host, seq=batch.seq, drops=msgspec.structs.asdict(batch.drops)
        )

    def _answer(self, conn: Connection, result: CommandResult) -> None:
        """Resolve a pending command with ``result`` only when it comes from the connection it was sent to.

        Command ids are not secret; an answer from any other connection (another agent forging a snapshot
        or an FR dump for an incident) is counted and dropped.
        """
        entry = self.pending.get(result.id)
        if entry is None:
            return
        target, future = entry
        if target is not conn:
            self.refusals.refused(
                "foreign_answer",
                "command_answer_refused",
                peer=conn.peer,
                host=conn.host,
                command=result.id[:64],
                sent_to=target.host,
            )
            return
        if not future.done():
            future.set_result(result)

    def _check_hello(self, hello: Hello) -> str:
        if not HOST_NAME.match(hello.host):
            return f"host name {hello.host[:80]!r} is not a valid host name"
        fleet = self.engine.fleet
        if hello.host not in fleet.hosts and len(fleet.hosts) >= self.config.limits.max_hosts:
            # make room: the longest-silent disconnected host that has been silent long enough to be flagged
            silent = fleet.silent_hosts(self.clock(), self.config.fleet.host_silent_after_s)
            if not silent:
                return (
                    f"the aggregator already tracks {self.config.limits.max_hosts} hosts, all recently seen"
                )
            log().warning(
                "host_evicted", host=silent[0], for_host=hello.host, max_hosts=self.config.limits.max_hosts
            )
            self.metrics.rejected("host_evicted")
            self.engine.forget_host(silent[0], self.clock())
        if len(hello.gpus) > self.config.limits.max_gpus_per_host:
            return f"{len(hello.gpus)} GPUs declared, at most {self.config.limits.max_gpus_per_host}"
        return ""


def _batch_over_limits(batch: Batch, limits: LimitsConfig) -> str:
    """What in ``batch`` exceeds ``[limits]`` (empty: nothing); the decoder already bounded every list."""
    procs = len(batch.procs) if batch.procs is not None else 0
    if (
        len(batch.samples) > limits.max_samples_per_batch
        or len(batch.events) > limits.max_events_per_batch
        or len(batch.heads) > limits.max_heads_per_batch
        or procs > limits.max_procs_per_batch
    ):
        return f"{len(batch.samples)} samples, {len(batch.events)} events, {len(batch.heads)} heads, {procs} procs"
    items = 0
    for heads in batch.heads:
        items += len(heads.pgs)
        for pg in heads.pgs:
            items += len(pg.in_flight) + (len(pg.ranks) if pg.ranks else 0)
    if items > limits.max_heads_items_per_batch:
        return f"heads carry {items} groups, group ranks and in-flight entries, at most {limits.max_heads_items_per_batch}"
    return ""


def _upgrade_accept(request: web.Request) -> str:
    """The ``Sec-WebSocket-Accept`` of a valid WebSocket upgrade request (RFC 6455 4.2.1); else 400/426."""
    headers = request.headers
    if headers.get("Upgrade", "").strip().lower() != "websocket":
        raise web.HTTPBadRequest(text="not a WebSocket upgrade (Upgrade: websocket)\n")
    if "upgrade" not in {token.strip().lower() for token in headers.get("Connection", "").split(",")}:
        raise web.HTTPBadRequest(text="not a WebSocket upgrade (Connection: upgrade)\n")
    if headers.get("Sec-WebSocket-Version", "").strip() != "13":
        raise web.HTTPUpgradeRequired(
            text="WebSocket version 13 only\n", headers={"Sec-WebSocket-Version": "13"}
        )
    accept = accept_key(headers.get("Sec-WebSocket-Key", ""))
    if accept is None:
        raise web.HTTPBadRequest(text="Sec-WebSocket-Key is not 16 bytes of base64\n")
    return accept


def _keepalive(request: web.Request) -> None:
    """TCP keepalive on an agent's socket: a vanished peer is noticed within about two minutes."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 15)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)

"""The aggregator's HTTP side: the agents' WebSocket stream, the REST API, /metrics and /healthz.

Ingest is strict and isolated per connection: the bearer token is compared in constant time before the
upgrade (401), the connection count is bounded (503), every frame is validated by the shared wire schema,
and a bad frame closes *that* connection with a close code saying why — 1007 malformed, 1008 protocol or
limit violation, 1009 over ``limits.max_frame_bytes``, 1002 broken WebSocket framing, 1003 text instead of
binary — with one log line; the other agents never notice. aiohttp serves the HTTP side up to the upgrade;
the upgraded stream is read and written by :mod:`sentinel.aggregator.wsconn`, each message handled where it
was read. Batches are acked once what they changed is committed to the state store; a resend of an applied
seq is acked and dropped (at-least-once delivery, exactly-once effect).

``/`` is deliberately left free: the status page is added through ``extra_routes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import gc
import hmac
import itertools
import logging
import math
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import WSCloseCode, web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from sentinel.aggregator.acks import DurableAcks
from sentinel.aggregator.detectors.straggler import straggler_hold_s
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.frdumps import settings_for_frame
from sentinel.aggregator.incidents import IncidentManager, IncidentStore
from sentinel.aggregator.latches import FleetLatches, FleetSeqWindows
from sentinel.aggregator.listener import PEER_GATE_KEY, PeerGate
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.aggregator.pushback import VerdictPush
from sentinel.aggregator.refusals import RefusalLog
from sentinel.aggregator.remediation import Remediator
from sentinel.aggregator.state import HostView
from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.aggregator.views import gpu_health, host_dict, job_detail, job_summary
from sentinel.aggregator.wsconn import (
    CLOSE_PROTOCOL,
    OP_BINARY,
    AgentSocket,
    accept_key,
    handshake_response,
)
from sentinel.config.aggregator import AggregatorConfig, LimitsConfig, ServerConfig
from sentinel.config.loader import read_bounded
from sentinel.log import get_logger
from sentinel.wire import Batch, Command, CommandResult, Hello, decode_agent_frame, encode


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.server")


HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
HOST_GLOB = re.compile(r"^[A-Za-z0-9._*?\[\]!-]{1,253}$")
CLOSE_UNSUPPORTED = 1003
CLOSE_MALFORMED = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_REPLACED = 4000
CLOSE_HOST_NOT_ALLOWED = 4003  # the token (or client certificate) may not speak for the host it claimed
MAX_TOKEN_BYTES = 4096
MAX_TOKENS = 10000
_json = msgspec.json.Encoder()


class TokenError(Exception):
    """The tokens file cannot be used (one line naming it and what is wrong)."""


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """One line of the tokens file: a bearer token and the host names it may speak for.

    ``hosts`` holds shell-style globs (``host-0*``); empty means any host name (a token-only line, kept for
    small labs and reported as a warning at start-up, since any holder can then speak for every host).
    """

    token: bytes
    hosts: tuple[str, ...] = ()
    line: int = 0

    @property
    def any_host(self) -> bool:
        return not self.hosts

    def allows(self, host: str) -> bool:
        return not self.hosts or any(fnmatch.fnmatchcase(host, glob) for glob in self.hosts)


def parse_token_line(line: str, number: int = 0) -> TokenGrant | None:
    """``TOKEN [HOSTGLOB ...]`` → a grant; None for a blank or ``#`` comment line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    token, *globs = text.split()
    if len(token.encode()) > MAX_TOKEN_BYTES:
        raise TokenError(f"token {number}: longer than {MAX_TOKEN_BYTES} bytes")
    for glob in globs:
        if not HOST_GLOB.match(glob):
            raise TokenError(f"token {number}: {glob[:80]!r} is not a host name glob")
    return TokenGrant(token.encode(), tuple(globs), number)


def load_tokens(path: Path) -> list[TokenGrant]:
    """The grants of a tokens file: ``TOKEN HOSTGLOB`` per line (blank lines and ``#`` comments ignored)."""
    try:
        raw = read_bounded(path, MAX_TOKENS * (MAX_TOKEN_BYTES + 1))
    except OSError as exc:
        raise TokenError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TokenError(f"{path}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    grants: list[TokenGrant] = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            grant = parse_token_line(line, number)
        except TokenError as exc:
            raise TokenError(f"{path}: line {exc}") from None
        if grant is not None:
            grants.append(grant)
    if not grants:
        raise TokenError(f"{path}: no token in the file")
    return grants


def as_grants(tokens: Iterable[str | TokenGrant]) -> list[TokenGrant]:
    """Tokens given in code (tests, the demo): grants as they are, strings parsed as tokens-file lines."""
    grants: list[TokenGrant] = []
    for number, item in enumerate(tokens, 1):
        grant = item if isinstance(item, TokenGrant) else parse_token_line(item, number)
        if grant is not None and grant.token:
            grants.append(grant)
    return grants


def server_ssl_context(server: ServerConfig) -> ssl.SSLContext | None:
    """The listener's TLS context (None: plain http/ws); raises :class:`TokenError` naming the bad file."""
    if not server.tls_cert_file:
        if server.tls_client_ca_file:
            raise TokenError("server.tls_client_ca_file: mutual TLS needs server.tls_cert_file too")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(server.tls_cert_file, server.tls_key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise TokenError(f"{server.tls_cert_file}: cannot load the certificate/key: {exc}") from None
    if server.tls_client_ca_file:
        try:
            context.load_verify_locations(cafile=server.tls_client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TokenError(f"{server.tls_client_ca_file}: cannot load the client CA: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def certificate_names(peercert: Any) -> tuple[str, ...]:
    """The DNS subjectAltNames and common name of a verified peer certificate (``getpeercert()``)."""
    if not isinstance(peercert, dict):
        return ()
    names = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    for rdn in peercert.get("subject", ()):
        names.extend(value for key, value in rdn if key == "commonName")
    return tuple(str(name) for name in names)


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


class Aggregator:
    """The running service: engine, connections, detector loop, incidents and metrics."""

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        tokens: Iterable[str | TokenGrant],
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        state_dir: Path | None = None,
        on_tick: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self._grants = as_grants(tokens)
        for grant in self._grants:
            if grant.any_host:
                log().warning(
                    "token_any_host",
                    line=grant.line,
                    detail="a token without a host glob may speak for every host; bind it: TOKEN HOSTGLOB",
                )
        self.metrics = AggregatorMetrics(config.fleet.cluster, registry)
        self.engine = Engine(config, metrics=self.metrics)
        self.metrics.attach(self.engine, lambda: len(self.by_host))
        #: every refused connection or frame: counted by reason, logged a few lines per interval
        self.refusals = RefusalLog(self.metrics)
        self.engine.fleet.refusals = self.refusals  # a host's claim on another host's rank, counted too
        #: open TCP connections per peer address, limited at accept (:class:`~.listener.AggregatorSite`)
        self.peer_gate = PeerGate(
            lambda: self.config.limits.max_connections_per_peer,
            self._peer_refused,
            handshake_timeout_s=config.limits.header_timeout_s,
        )
        self.connections: set[Connection] = set()
        self.by_host: dict[str, Connection] = {}
        #: command id → (the connection it went to, its answer); only that connection may answer it
        self.pending: dict[str, tuple[Connection, asyncio.Future[CommandResult]]] = {}
        directory = state_dir if state_dir is not None else Path(config.server.state_dir)
        store: IncidentStore | None = None
        if config.incidents.enabled:
            try:
                store = IncidentStore(directory)
            except (OSError, Exception) as exc:  # sqlite3.Error too: incidents then live in memory only
                # loud: without the store, incidents vanish on a restart (SentinelStateStoreFailing fires)
                self.metrics.state_errors += 1
                log().error(
                    "incident_store_unavailable",
                    state_dir=str(directory),
                    error=str(exc),
                    detail="incidents are kept in memory only; fix server.state_dir",
                )
        self.incidents = IncidentManager(
            self.engine,
            store,
            self.request,
            config.incidents,
            clock=clock,
            on_saved=lambda _: self.metrics.incidents.inc(),
            fr_dumps=settings_for_frame(config.limits.max_frame_bytes),
        )
        self.store = self._open_store(directory)
        #: acks sent once the state a batch changed is committed (group commit; at once without a store)
        self.acks = DurableAcks(self.store)
        self.metrics.acks = self.acks
        self.engine.listeners.append(self.incidents.on_change)
        self.engine.listeners.append(self._log_change)
        self.pushback = VerdictPush(
            self.engine.book, learned_quorum=lambda: self.config.remediation.learned_quorum
        )
        self.engine.listeners.append(self.pushback.on_change)
        self.engine.forget_listeners.append(self._host_forgotten)
        self.remediator = Remediator(
            config.remediation,
            self.engine.book,
            state_dir=directory,
            cluster=config.fleet.cluster,
            registry=self.metrics.registry,
            clock=clock,
        )
        self.engine.listeners.append(self.remediator.on_change)
        self.on_tick = on_tick
        self._ticker: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._drops_logged: dict[str, float] = {}
        self._per_peer: dict[str, int] = {}
        self._warned: dict[str, tuple[float, int]] = {}
        self._next_gc_freeze = 0.0
        self._next_gc_full = 0.0
        self._stopping = False  # stop() began: agents' messages are no longer applied (nor acked)
        self.started_at = clock()

    def _open_store(self, directory: Path) -> StateStore | None:
        """Durable state: restore verdicts and latched hardware facts before any agent is heard.

        A database that cannot be opened, or is not one this sentinel reads, raises
        :class:`~sentinel.aggregator.store.StoreError` (one line): the aggregator does not start, as every
        ack would otherwise promise a durability it does not have (the agents spool meanwhile).
        """
        cfg = self.config
        if not cfg.state.enabled:
            return None
        store = StateStore(directory, flush_interval_s=cfg.state.flush_interval_s)
        self.engine.book.restore_hold_s = restore_holds(cfg)
        now = self.clock()
        store.register(self.engine.book, now)
        store.register(FleetLatches(self.engine.fleet), now)
        store.register(FleetSeqWindows(self.engine.fleet), now)  # after the latches: they create the hosts
        store.register(BuiltinsHolder("detectors", dict(self.engine.detectors)), now)
        self.metrics.store = store
        return store

    # -- lifecycle ------------------------------------------------------------------------------------

    def reload(self, load: Callable[[], AggregatorConfig]) -> bool:
        """SIGHUP: read the configuration again and apply it without a restart; False when refused.

        A file that does not load (bad TOML, a bad value) is refused with its one-line error and the
        running configuration stays. ``server`` and ``limits`` (listener, tokens, bounds already in use)
        only change at a restart; a reload that changes them says so and keeps the running values.
        """
        try:
            new = load()
        except Exception as exc:  # ConfigError and anything else: the old configuration stays
            self.metrics.reload(False)
            log().error("config_reload_refused", error=str(exc), kept="the running configuration")
            return False
        old = self.config
        fixed = [name for name in ("server", "limits") if getattr(new, name) != getattr(old, name)]
        if fixed:
            log().warning("config_reload_needs_restart", sections=fixed)
            new = msgspec.structs.replace(new, server=old.server, limits=old.limits)
        self.config = new
        self.incidents.config = new.incidents
        self.engine.reconfigure(new, self.clock())
        self.metrics.reload(True)
        log().info("config_reloaded", disabled_detectors=list(new.detect.disabled))
        return True

    async def start(self) -> None:
        await self.remediator.start()
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_loop(), name="aggregator-tick")

    async def stop(self) -> None:
        # nothing more is applied; what was is committed and acked before the streams close, so a clean
        # restart makes the agents resend nothing twice
        self._stopping = True
        if self.store is not None:
            await self.acks.drain(5.0)
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.ws.close(WSCloseCode.GOING_AWAY, b"aggregator shutting down")
        for _, future in self.pending.values():
            future.cancel()
        self.pending.clear()
        for task in list(self.incidents.tasks):
            task.cancel()
        await self.incidents.drain()
        self.acks.close()
        if self.store is not None:  # SIGTERM / systemctl restart: everything known is written
            await asyncio.to_thread(self.store.close, 20.0)  # within systemd's TimeoutStopSec (30 s)
            self.store = None
        await self.remediator.stop()

    def _gc_maintenance(self, monotonic: float) -> None:
        """Keep full garbage collections off the ingest path.

        The fleet state is hundreds of thousands of long-lived objects, and with two 24,576-rank jobs ~25,000
        heads (each with its lists) arrive every second and live two: left to CPython's thresholds, full
        collections came every few seconds at ~0.25-0.3 s each, inside whatever step was running. Every object
        is frozen (ignored by collections) each ``fleet.gc_freeze_interval_s`` (1 s), so young collections
        only see the last second's objects (engine bench: their pauses 0.19 -> 0.10 s, their CPU 2.2 -> 1.2 s
        per 30 s), CPython's own full collections are off while
        the tick loop runs (:func:`_no_automatic_full_collections`), and a full collection runs rarely, at
        a known cost (``fleet.gc_full_interval_s``).
        """
        fleet = self.config.fleet
        if fleet.gc_full_interval_s and monotonic >= self._next_gc_full:
            self._next_gc_full = monotonic + fleet.gc_full_interval_s
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        elif fleet.gc_freeze_interval_s and monotonic >= self._next_gc_freeze:
            # no collection first (one over 30 s of young objects paused the loop ~0.2 s): the few cycles
            # frozen with the rest are reclaimed by the next full collection
            self._next_gc_freeze = monotonic + fleet.gc_freeze_interval_s
            gc.freeze()

    async def _tick_loop(self) -> None:
        with _no_automatic_full_collections(bool(self.config.fleet.gc_full_interval_s)):
            await self._ticks()

    async def _ticks(self) -> None:
        period = self.config.fleet.tick_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        self._next_gc_freeze = loop.time() + self.config.fleet.gc_freeze_interval_s
        self._next_gc_full = loop.time() + self.config.fleet.gc_full_interval_s
        while True:
            next_at += period
            busy = 0.0
            try:
                # one detector per step, the loop resumed in between: ingest (and its hardware verdicts)
                # waits at most one detector's run, not the whole tick
                stages = self.engine.tick_stages(self.clock())
                while True:
                    started = time.perf_counter()
                    more = next(stages, None) is not None
                    busy += time.perf_counter() - started
                    if not more:
                        break
                    await asyncio.sleep(0)
            except Exception as exc:  # a detector bug must not stop detection of everything else
                log().error("tick_failed", error=f"{type(exc).__name__}: {exc}")
            self.metrics.tick_seconds.observe(busy)
            if self.store is not None:  # detector memory copied in steps ahead of the flush
                for _ in self.store.prepare():
                    await asyncio.sleep(0)
            if self.store is not None and self.store.due(loop.time()):
                self.store.flush(loop.time())
            self.remediator.tick(self.clock())
            if self.pushback.marked:
                try:
                    await self.pushback.flush(self._send)
                except Exception as exc:  # health pushback must not stop the detector loop
                    log().error("verdict_push_failed", error=f"{type(exc).__name__}: {exc}")
            self._gc_maintenance(loop.time())
            self.refusals.flush()
            if self.on_tick is not None:
                self.on_tick(self.clock())
            delay = next_at - loop.time()
            if delay < 0:
                next_at = loop.time()
                delay = 0
            await asyncio.sleep(delay)

    @staticmethod
    def _log_change(change: Any) -> None:
        v = change.verdict
        if change.what in ("opened", "closed"):
            log().info(
                f"verdict_{change.what}",
                id=v.id,
                kind=v.kind,
                reason=v.reason,
                action=v.action,
                host=v.host,
                gpu=v.gpu,
                job=v.job,
                rank=v.rank,
            )

    # -- auth -----------------------------------------------------------------------------------------

    def grants_for(self, header: str) -> list[TokenGrant]:
        """The grants of the bearer token in ``header`` (empty: not a valid token).

        Every accepted token is compared, in constant time, so timing tells nothing about which matched.
        """
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return []
        given = token.strip().encode()[:MAX_TOKEN_BYTES]
        matched = []
        for grant in self._grants:
            if hmac.compare_digest(given, grant.token):
                matched.append(grant)
        return matched

    def token_ok(self, header: str) -> bool:
        return bool(self.grants_for(header))

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
        if self._stopping:
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

    # -- REST -----------------------------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "agents": len(self.by_host),
                "uptime_s": self.clock() - self.started_at,
                "cluster": self.config.fleet.cluster,
            }
        )

    async def metrics_endpoint(self, _: web.Request) -> web.Response:
        """The exposition, rendered one metric family at a time with the event loop resumed in between.

        At 6,144 hosts the per-host families (last seen, clock rate and offset) are ~18,000 series: rendered
        in one piece a scrape held the loop for 0.13-0.4 s, which every batch behind it waited for. The
        collectors compute each family from the engine's state in one go (no await inside a pass over the
        fleet), so each family is consistent; families may be up to a few milliseconds apart."""
        parts: list[bytes] = []
        for family in self.metrics.registry.collect():
            parts.append(generate_latest(_Families(family)))
            await asyncio.sleep(0)
        return web.Response(body=b"".join(parts), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _page(
        self, request: web.Request, key: str, items: Sequence[Any], render: Callable[[Any], Any]
    ) -> web.Response:
        """One page of ``items`` rendered, as ``{key: [...], total, offset, next_offset}``.

        The page is bounded (``server.api_page_size``), rendered in slices that give the event loop back to
        ingest between them, and encoded to JSON in a worker thread (what it encodes is no longer shared).
        """
        size = self.config.server.api_page_size
        try:
            limit = min(int(request.query.get("limit", size)), size)
            offset = int(request.query.get("offset", 0))
        except ValueError:
            raise web.HTTPBadRequest(text="limit and offset must be integers\n") from None
        if limit < 0 or offset < 0:
            raise web.HTTPBadRequest(text="limit and offset must not be negative\n")
        chosen = items[offset : offset + limit]
        out = []
        for index, item in enumerate(chosen):
            out.append(render(item))
            if index % 100 == 99:
                await asyncio.sleep(0)
        end = offset + len(out)
        document = {
            key: out,
            "total": len(items),
            "offset": offset,
            "next_offset": end if end < len(items) else None,
        }
        body = await asyncio.to_thread(_json.encode, document)
        return web.Response(body=body, content_type="application/json")

    async def verdicts(self, request: web.Request) -> web.Response:
        state = request.query.get("state")
        if state not in (None, "open", "closed"):
            raise web.HTTPBadRequest(text="state must be open or closed\n")
        return await self._page(request, "verdicts", self.engine.verdicts(state), lambda v: v.to_dict())

    async def jobs(self, request: web.Request) -> web.Response:
        jobs = list(self.engine.fleet.jobs.values())
        return await self._page(request, "jobs", jobs, lambda job: job_summary(self.engine, job))

    async def job(self, request: web.Request) -> web.Response:
        job = self.engine.fleet.jobs.get(request.match_info["id"])
        if job is None:
            raise web.HTTPNotFound(text="no such job\n")
        return _json_response(job_detail(self.engine, job, self.clock()))

    async def hosts(self, request: web.Request) -> web.Response:
        health, now = gpu_health(self.engine), self.clock()
        hosts = list(self.engine.fleet.hosts.values())
        return await self._page(request, "hosts", hosts, lambda h: host_dict(self.engine, h, now, health))

    async def incident_list(self, _: web.Request) -> web.Response:
        items = await asyncio.to_thread(self.incidents.list)
        return _json_response({"incidents": items})

    async def incident(self, request: web.Request) -> web.Response:
        incident_id = request.match_info["id"]
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", incident_id):
            raise web.HTTPNotFound(text="no such incident\n")
        found = await asyncio.to_thread(self.incidents.get, incident_id)
        if found is None:
            raise web.HTTPNotFound(text="no such incident\n")
        return _json_response(found)


def restore_holds(config: AggregatorConfig) -> dict[str, float]:
    """How long each detector needs after a restart to judge its restored verdicts again from fresh input.

    The stuck detector needs fresh heads and a wait of ``min_wait_s``; the straggler detector needs its
    hosts' clock rates measured again, its moving averages and ``persistence`` evaluations in a row; host_silent needs the silence threshold (every
    restored host counts as seen at the restart); the network detector needs each host's next port
    records. Hardware verdicts need no hold: the latched facts they
    are judged from are restored with them.
    """
    fleet, detect = config.fleet, config.detect
    return {
        "stuck": detect.stuck.min_wait_s + detect.stuck.heads_fresh_s + 2 * fleet.tick_s,
        "straggler": straggler_hold_s(detect.straggler),
        "host_silent": fleet.host_silent_after_s + 2 * fleet.tick_s,
        # port records arrive every agent ib.interval_s (2 s by default); a few of them rebuild every port
        "network": 10.0 + 2 * fleet.tick_s,
    }


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


class _Families:
    """One metric family as a registry (``generate_latest`` renders what ``collect`` returns)."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


#: CPython's third threshold while the tick loop runs: full collections only from ``_gc_maintenance``
NO_FULL_COLLECTIONS = 1 << 30


@contextlib.contextmanager
def _no_automatic_full_collections(on: bool) -> Iterator[None]:
    """CPython's automatic full (generation 2) collections off, restored after (a daemon's lifetime; tests
    run many aggregators in one process). Young collections stay; ``fleet.gc_full_interval_s`` collects
    cyclic garbage at its own pace."""
    if not on:
        yield
        return
    old = gc.get_threshold()
    gc.set_threshold(old[0], old[1], NO_FULL_COLLECTIONS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


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


def load_api_tokens(path: Path) -> list[bytes]:
    """The REST API's read tokens, one per line (blank lines and ``#`` comments ignored)."""
    return [grant.token for grant in load_tokens(path)]


def read_token_middleware(aggregator: Aggregator, tokens: Sequence[bytes]) -> Any:
    """Requests under ``/api/v1/`` (but the agents' stream, which has its own tokens) need a read token."""

    @web.middleware
    async def require_read_token(request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if path.startswith("/api/v1/") and path != "/api/v1/stream":
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            given = token.strip().encode()[:MAX_TOKEN_BYTES]
            ok = False
            for accepted in tokens:
                ok |= hmac.compare_digest(given, accepted)
            if scheme.lower() != "bearer" or not ok:
                aggregator.refusals.refused(
                    "api_unauthorized", "api_unauthorized", peer=request.remote or "?", path=path[:200]
                )
                raise web.HTTPUnauthorized(
                    text="this API needs a read token: Authorization: Bearer <token>\n",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        response: web.StreamResponse = await handler(request)
        return response

    return require_read_token


def _json_response(data: Any) -> web.Response:
    return web.Response(body=_json.encode(data), content_type="application/json")


AGGREGATOR_KEY: web.AppKey[Aggregator] = web.AppKey("sentinel_aggregator", Aggregator)


class LoopErrorLimiter(logging.Filter):
    """Rate-limited reporting of what the event loop and aiohttp log outside our handlers.

    An accept that fails (no file descriptors left) is retried by asyncio and logged with a traceback every
    time; under a connection flood that wrote 55 MB of log in 6 s. Each kind is counted in
    ``sentinel_aggregator_loop_errors_total`` and logged once per ``every_s`` with the count suppressed.
    Installed as the loop's exception handler and as a filter on the ``asyncio``/``aiohttp`` loggers.
    """

    LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.access")

    def __init__(
        self, metrics: AggregatorMetrics, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.metrics = metrics
        self.every_s = every_s
        self.clock = clock
        self._next: dict[str, tuple[float, int]] = {}

    def report(self, kind: str, message: str) -> bool:
        """Count one; True when it is to be logged now."""
        kind = kind[:80]
        self.metrics.loop_errors.labels(self.metrics.cluster, kind).inc()
        now = self.clock()
        until, suppressed = self._next.get(kind, (-math.inf, 0))
        if now < until:
            self._next[kind] = (until, suppressed + 1)
            return False
        if len(self._next) > 1000:
            self._next.clear()
        self._next[kind] = (now + self.every_s, 0)
        log().error("loop_error", kind=kind, message=message[:300], suppressed=suppressed)
        return True

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        kind = type(exc).__name__ if exc is not None else "loop"
        self.report(
            kind, f"{context.get('message', '')}: {exc}" if exc is not None else str(context.get("message"))
        )

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.report(record.name, record.getMessage())
        return False  # reported (or suppressed) above, in our own format

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self)
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(None)
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """An AppRunner for the aggregator's app with its HTTP bounds: request headers (and idle keep-alive
    connections) time out after ``limits.header_timeout_s``, so sockets that never send a request are closed
    instead of holding file descriptors."""
    limits = app[AGGREGATOR_KEY].config.limits
    kwargs.setdefault("access_log", None)
    return web.AppRunner(app, keepalive_timeout=limits.header_timeout_s, **kwargs)


def create_app(
    config: AggregatorConfig | None = None,
    *,
    tokens: Iterable[str | TokenGrant] | None = None,
    clock: Callable[[], float] = time.time,
    registry: CollectorRegistry | None = None,
    state_dir: Path | None = None,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
    on_tick: Callable[[float], None] | None = None,
) -> web.Application:
    """The aggregator as an aiohttp application; ``app[AGGREGATOR_KEY]`` is its :class:`Aggregator`.

    ``tokens`` defaults to the lines of ``config.server.tokens_file`` (raises :class:`TokenError`).
    ``extra_routes`` are added as they are (the status page at ``/`` comes this way).
    """
    config = config or AggregatorConfig()
    if tokens is None:
        tokens = load_tokens(Path(config.server.tokens_file))
    aggregator = Aggregator(
        config, tokens=tokens, clock=clock, registry=registry, state_dir=state_dir, on_tick=on_tick
    )
    middlewares = []
    if config.server.api_token_file:
        middlewares.append(
            read_token_middleware(aggregator, load_api_tokens(Path(config.server.api_token_file)))
        )
    app = web.Application(client_max_size=1024 * 1024, middlewares=middlewares)
    app[AGGREGATOR_KEY] = aggregator
    app[PEER_GATE_KEY] = aggregator.peer_gate
    app.add_routes(
        [
            web.get("/healthz", aggregator.healthz),
            web.get("/metrics", aggregator.metrics_endpoint),
            web.get("/api/v1/stream", aggregator.stream),
            web.get("/api/v1/verdicts", aggregator.verdicts),
            web.get("/api/v1/jobs", aggregator.jobs),
            web.get("/api/v1/jobs/{id}", aggregator.job),
            web.get("/api/v1/hosts", aggregator.hosts),
            web.get("/api/v1/incidents", aggregator.incident_list),
            web.get("/api/v1/incidents/{id}", aggregator.incident),
        ]
    )
    app.add_routes(list(extra_routes))

    async def on_startup(_: web.Application) -> None:
        await aggregator.start()

    async def on_shutdown(_: web.Application) -> None:
        await aggregator.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app

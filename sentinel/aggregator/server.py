"""The aggregator assembled: engine, durable state, incidents, remediation and the parts that serve them.

:class:`Aggregator` builds the engine and its listeners, then hands each job to its own module — who may
connect (:mod:`.identity`), the agents' streams (:mod:`.stream`), the tick loop (:mod:`.tick_loop`) and
the REST side (:mod:`.rest`) — and :func:`create_app` mounts them on one aiohttp application.
``/`` is deliberately left free: the status page is added through ``extra_routes``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from sentinel.aggregator.acks import DurableAcks
from sentinel.aggregator.detectors.straggler import straggler_hold_s
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.frdumps import settings_for_frame
from sentinel.aggregator.goodput import GoodputLedger
from sentinel.aggregator.identity import TokenBook, TokenGrant, as_grants, load_api_tokens, load_tokens
from sentinel.aggregator.incidents import IncidentManager, IncidentStore
from sentinel.aggregator.latches import FleetLatches, FleetSeqWindows
from sentinel.aggregator.listener import PEER_GATE_KEY, AggregatorSite, PeerGate
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.aggregator.pushback import VerdictPush
from sentinel.aggregator.refusals import RefusalLog
from sentinel.aggregator.remediation import Remediator
from sentinel.aggregator.rest import RestApi, read_token_middleware
from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.aggregator.stream import AgentStreams, Connection
from sentinel.aggregator.tick_loop import TickLoop
from sentinel.config.aggregator import AggregatorConfig
from sentinel.log import get_logger
from sentinel.wire import Command, CommandResult


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.server")


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
        self._config = config
        self.clock = clock
        grants = as_grants(tokens)
        for grant in grants:
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
        self.pushback = VerdictPush(
            self.engine.book, learned_quorum=lambda: self.config.remediation.learned_quorum
        )
        self.streams = AgentStreams(
            config,
            engine=self.engine,
            tokens=TokenBook(grants),
            metrics=self.metrics,
            refusals=self.refusals,
            pushback=self.pushback,
            clock=clock,
        )
        #: open TCP connections per peer address, limited at accept (:class:`~.listener.AggregatorSite`)
        self.peer_gate = PeerGate(
            lambda: self.config.limits.max_connections_per_peer,
            self.streams._peer_refused,
            handshake_timeout_s=config.limits.header_timeout_s,
            on_tls_failed=self.streams._tls_refused,
        )
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
        #: each incident's phases and the GPU time it cost (after the incident manager: it names incidents)
        self.goodput = GoodputLedger(
            self.engine.book,
            self.engine.fleet,
            clock=clock,
            cluster=config.fleet.cluster,
            registry=self.metrics.registry,
        )
        self.store = self._open_store(directory)
        #: acks sent once the state a batch changed is committed (group commit; at once without a store)
        self.acks = DurableAcks(self.store)
        self.metrics.acks = self.acks
        self.streams.acks = self.acks
        self.engine.listeners.append(self.incidents.on_change)
        self.engine.listeners.append(self.goodput.on_change)
        self.engine.listeners.append(self._log_change)
        self.engine.listeners.append(self.pushback.on_change)
        self.engine.forget_listeners.append(self.streams._host_forgotten)
        self.engine.forget_listeners.append(self.goodput.forget_host)
        self.remediator = Remediator(
            config.remediation,
            self.engine.book,
            state_dir=directory,
            cluster=config.fleet.cluster,
            registry=self.metrics.registry,
            clock=clock,
            before_drain=self.incidents.evidence_gate.wait,
        )
        self.engine.listeners.append(self.remediator.on_change)
        self.ticks = TickLoop(
            config,
            engine=self.engine,
            metrics=self.metrics,
            refusals=self.refusals,
            pushback=self.pushback,
            remediator=self.remediator,
            goodput=self.goodput,
            store=self.store,
            send=self.streams._send,
            clock=clock,
            on_tick=on_tick,
        )
        self.rest = RestApi(
            config,
            engine=self.engine,
            incidents=self.incidents,
            goodput=self.goodput,
            metrics=self.metrics,
            agents=lambda: len(self.by_host),
            clock=clock,
        )

    @property
    def config(self) -> AggregatorConfig:
        return self._config

    @config.setter
    def config(self, config: AggregatorConfig) -> None:
        """The running configuration, replaced on reload in every part that reads it."""
        self._config = config
        self.streams.config = config
        self.ticks.config = config
        self.rest.config = config

    @property
    def connections(self) -> set[Connection]:
        return self.streams.connections

    @property
    def by_host(self) -> dict[str, Connection]:
        return self.streams.by_host

    @property
    def pending(self) -> dict[str, tuple[Connection, asyncio.Future[CommandResult]]]:
        return self.streams.pending

    async def request(self, host: str, command: Command, timeout_s: float) -> CommandResult | None:
        """Send a command to ``host``'s agent and wait for its result (None: not connected / no answer)."""
        return await self.streams.request(host, command, timeout_s)

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
        store.register(self.goodput, now)
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
        self.ticks.start()

    async def stop(self) -> None:
        # nothing more is applied; what was is committed and acked before the streams close, so a clean
        # restart makes the agents resend nothing twice
        self.streams.stopping = True
        if self.store is not None:
            await self.acks.drain(5.0)
        await self.ticks.stop()
        self.streams.close_all()
        for task in list(self.incidents.tasks):
            task.cancel()
        await self.incidents.drain()
        self.acks.close()
        if self.store is not None:  # SIGTERM / systemctl restart: everything known is written
            await asyncio.to_thread(self.store.close, 20.0)  # within systemd's TimeoutStopSec (30 s)
            self.store = None
        await self.remediator.stop()

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


AGGREGATOR_KEY: web.AppKey[Aggregator] = web.AppKey("sentinel_aggregator", Aggregator)


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """An AppRunner for the aggregator's app with its HTTP bounds: request headers (and idle keep-alive
    connections) time out after ``limits.header_timeout_s``, so sockets that never send a request are closed
    instead of holding file descriptors."""
    limits = app[AGGREGATOR_KEY].config.limits
    kwargs.setdefault("access_log", None)
    return web.AppRunner(app, keepalive_timeout=limits.header_timeout_s, **kwargs)


def make_site(runner: web.AppRunner, **kwargs: Any) -> AggregatorSite:
    """The listener of ``server.listen_host``:``server.listen_port`` for a runner of the aggregator's app,
    shared with other aggregator processes on this machine when ``server.reuse_port`` (SO_REUSEPORT)."""
    server = runner.app[AGGREGATOR_KEY].config.server
    return AggregatorSite(
        runner, server.listen_host, server.listen_port, reuse_port=server.reuse_port, **kwargs
    )


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
            read_token_middleware(aggregator.refusals, load_api_tokens(Path(config.server.api_token_file)))
        )
    app = web.Application(client_max_size=1024 * 1024, middlewares=middlewares)
    app[AGGREGATOR_KEY] = aggregator
    app[PEER_GATE_KEY] = aggregator.peer_gate
    app.add_routes(
        [
            web.get("/healthz", aggregator.rest.healthz),
            web.get("/metrics", aggregator.rest.metrics_endpoint),
            web.get("/api/v1/stream", aggregator.streams.stream),
            web.get("/api/v1/verdicts", aggregator.rest.verdicts),
            web.get("/api/v1/jobs", aggregator.rest.jobs),
            web.get("/api/v1/jobs/{id}", aggregator.rest.job),
            web.get("/api/v1/hosts", aggregator.rest.hosts),
            web.get("/api/v1/incidents", aggregator.rest.incident_list),
            web.get("/api/v1/incidents/{id}", aggregator.rest.incident),
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

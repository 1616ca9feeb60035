"""The host agent: collectors → one batch per tick → ring buffer + spool → WebSocket; /metrics; commands.

``Agent(config, source, inputs=None, clock=time.time)`` takes its GPU source (and, for a simulated host, the
host's other OS boundaries: :class:`~sentinel.agent.source.HostInputs`) from the caller, so ``sentinel demo``
can run many agents in one process on simulated hosts::

    agents = [Agent(cfg_for(host), host, host.inputs(), clock) for host in sim.hosts]
    await asyncio.gather(*(a.run() for a in agents))      # each ticks, streams, serves its own registry
    for a in agents: a.request_stop()

``sentinel sim`` (virtual clock) builds them with ``inline=True`` (no thread, no event loop) and drives the
ticks itself: ``batch = agent.step_inline(now)``, then feeds the batch (None: the tick was held, see
``stream.coalesce_ticks``) to the aggregator's engine in-process (with ``stream.enabled = false``) after
:meth:`Agent.hello` whenever the inventory changed.

This module wires the parts and runs the daemon's lifecycle; the parts do the work: the collectors
(:mod:`.registry`) write into a :class:`~sentinel.agent.sink.TickSink`, each tick's batch goes through the
:class:`~sentinel.agent.outbox.Outbox` (ring, spool), commands reach only their targets (:mod:`.commands`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sentinel import __version__
from sentinel.agent.batch import (
    fill_heads,
)
from sentinel.agent.collectors.base import Collectors
from sentinel.agent.collectors.gpu import GpuCollector
from sentinel.agent.collectors.lines import LineProcessor
from sentinel.agent.collectors.xid import flush_xids
from sentinel.agent.commands import CommandTargets, dispatch
from sentinel.agent.evidence import EvidenceCapture, GpuReads
from sentinel.agent.fr_control import FrDumps, LocalRanks
from sentinel.agent.health import LocalHealth, cannot_tell
from sentinel.agent.health import report as health_report
from sentinel.agent.http import start_http
from sentinel.agent.jobs import JobMapper, run_listpids
from sentinel.agent.kernel_window import KernelWindow
from sentinel.agent.kmsg import current_boot_id
from sentinel.agent.metrics import AgentCounters, AgentMetricsCollector, GpuView, make_registry
from sentinel.agent.outbox import Outbox
from sentinel.agent.probe import ProbeServer
from sentinel.agent.registry import BuildContext, assemble, build_collectors
from sentinel.agent.ring import RingBuffer
from sentinel.agent.shipper import Shipper
from sentinel.agent.sink import TickSink
from sentinel.agent.source import GpuSource, HostInputs
from sentinel.agent.spool import SeqAllocator, Spool, stream_instance
from sentinel.agent.stacks import PySpy
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.xid.merge import XidMerger
from sentinel.config.agent import AgentConfig
from sentinel.log import get_logger
from sentinel.systemd import SystemdNotifier
from sentinel.wire import (
    Batch,
    Command,
    CommandResult,
    FrDumpAnswer,
    GpuInfo,
    Hello,
    ProcInfo,
    Snapshot,
)

log = get_logger(module="agent")

SHUTDOWN_DRAIN_S = 3.0


def _end_nap(nap: asyncio.Future[None]) -> None:
    if not nap.done():
        nap.set_result(None)


class Agent:
    """One host's agent. See the module docstring for how to run one or many."""

    def __init__(
        self,
        config: AgentConfig,
        source: GpuSource,
        inputs: HostInputs | None = None,
        clock: Callable[[], float] = time.time,
        *,
        notifier: SystemdNotifier | None = None,
        inline: bool = False,
    ) -> None:
        self.config = config
        self.source = source
        self.inputs = inputs if inputs is not None else HostInputs()
        #: run every collector on the caller's thread with no event loop (``sentinel sim``): see step_inline
        self.inline = inline
        self.boot_id = self.inputs.boot_id if self.inputs.boot_id is not None else current_boot_id()
        #: bumped whenever the GPU inventory is (re)read: a new hello is due (the shipper reconnects)
        self.inventory_changes = 0
        self.clock = clock
        self.host = config.agent.host or socket.gethostname()
        self.cluster = config.agent.cluster
        self.started_at = clock()
        self.counters = AgentCounters()
        #: what the collectors write into: this host's facts and the tick in progress
        self.sink = TickSink(self.host, self.counters, self._inventory_changed)
        self.ring = RingBuffer(self.host, config.ring.window_s, config.ring.max_bytes)
        self.metrics = AgentMetricsCollector(self.cluster, self.host, self.gpus, self.counters)
        self.registry = make_registry(self.metrics)
        self.notifier = (
            notifier
            if notifier is not None
            else (SystemdNotifier() if config.systemd.notify else SystemdNotifier(env={}))
        )
        self.ranks = LocalRanks(self.sink.procs)
        self.fr_dumps = FrDumps(config.probe, self.ranks, simulated=self.inputs.simulated)
        self._stop = asyncio.Event()
        #: the wait for the next tick, ended early by :meth:`request_stop`
        self._nap: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.http_port: int | None = None
        self._http: Any = None
        self.health = LocalHealth(self.host)
        #: the node-health rules run only where someone can ask (``sentinel health`` over the HTTP endpoint):
        #: the demo's in-process agents, which have none, do not pay for them
        self.health_enabled = bool(config.metrics.listen_host)

        state_dir = Path(config.agent.state_dir)
        #: state that outlives a restart is kept only in an existing folder ("" keeps none: a simulated host)
        self.durable = bool(config.agent.state_dir) and state_dir.is_dir()
        durable = self.durable
        self.spool: Spool | None = None
        if config.stream.enabled:
            urls = config.stream.urls()
            self.spool = Spool(
                state_dir / "spool",
                config.stream.spool_max_bytes,
                consumers=tuple(urls) if len(urls) > 1 else (),
            )
            self.seq = SeqAllocator(state_dir / "seq", floor=self.spool.max_seq + 1)
            #: names this numbering (sent in the Hello): a wiped state directory is a new instance
            self.instance_id = stream_instance(state_dir / "instance")
        else:
            self.seq = SeqAllocator(state_dir / "seq" if durable else None)
            self.instance_id = stream_instance(state_dir / "instance" if durable else None)
        #: each tick's batch: numbered, kept in the ring, fitted to a frame, spooled
        self.outbox = Outbox(
            self.ring, self.seq, self.spool, self.counters, coalesce_ticks=config.stream.coalesce_ticks
        )
        self.shipper: Shipper | None = None
        if self.spool is not None:
            self.shipper = Shipper(
                config.stream,
                spool=self.spool,
                hello=self._hello,
                on_command=self.handle_command,
                counters=self.counters,
                host=self.host,
            )

        self.expected_gpus_path: Path | None = state_dir / "gpus.expected" if durable else None
        self.kmsg_cursor_path: Path | None = state_dir / "kmsg.cursor" if durable else None
        self.xids = XidMerger(
            wait_s=config.collect.xid_merge_wait_s,
            window_s=config.collect.xid_dedup_window_s,
            flood_window_s=config.collect.xid_flood_window_s,
        )
        #: every recent kernel line, for incident evidence (:mod:`sentinel.agent.evidence`)
        self.kernel_window = KernelWindow()
        self.lines = LineProcessor(
            self.sink, self.xids, forward_info=config.logs.forward_info, recent=self.kernel_window
        )
        #: maps one pid afresh before its stack is read (its own cache: a reused pid has a new start time)
        self._evidence_mapper = JobMapper(listpids=lambda: run_listpids(self.host))
        self.evidence = EvidenceCapture(
            self.host,
            procs=self.sink.procs,
            gpus=self._gpu_reads,
            kernel=self.kernel_window,
            stacks=None if self.inputs.simulated else PySpy(),
            problem=self._evidence_problem,
            remap=self._remap_rank,
            clock=clock,
        )
        self.collectors = Collectors(self.counters, config.collect.tick_s, inline=inline)
        built = build_collectors(
            BuildContext(
                config=config,
                host=self.host,
                cluster=self.cluster,
                source=source,
                inputs=self.inputs,
                sink=self.sink,
                counters=self.counters,
                lines=self.lines,
                xids=self.xids,
                inline=inline,
                durable=durable,
                expected_gpus_path=self.expected_gpus_path,
                kmsg_cursor_path=self.kmsg_cursor_path,
            )
        )
        for collector in built:
            self.collectors.add(collector)
        parts = assemble(built)
        self.gpu_collector: GpuCollector | None = parts.gpu  # None: the nvml collector is disabled
        self.probe: ProbeServer | None = parts.probe  # bound on start
        for families in parts.families:
            self.registry.register(families)

    # -- host facts (kept by the sink) ----------------------------------------------------------------------

    @property
    def gpus(self) -> dict[int, GpuView]:
        return self.sink.gpus

    @property
    def inventory(self) -> list[GpuInfo]:
        return self.sink.inventory

    @property
    def gpu_source(self) -> GpuSourceHealth | None:
        return self.sink.gpu_source

    def _inventory_changed(self, _: list[GpuInfo]) -> None:
        """The GPU inventory was (re)read: a new hello is due (to the local rules and to the aggregator)."""
        self.inventory_changes += 1
        self.health.hello(self._hello(-1), self.clock())
        if self.shipper is not None:
            self.shipper.request_reconnect()

    # -- one tick -------------------------------------------------------------------------------------------

    def step_inline(self, now: float) -> Batch | None:
        """One tick on the caller's thread, without an event loop (an ``inline`` agent: ``sentinel sim``);
        returns what :meth:`step` does.

        Every collector of an inline agent completes without waiting (its blocking calls run in place, a
        simulated hang is declared by the source), so :meth:`step`'s coroutine finishes on its first resume;
        one that tried to wait would be a bug in the inline path and is refused loudly.
        """
        if not self.inline:
            raise RuntimeError("step_inline needs an agent built with inline=True")
        coro = self.step(now)
        try:
            coro.send(None)
        except StopIteration as done:
            batch: Batch | None = done.value
            return batch
        coro.close()
        raise RuntimeError("an inline agent's tick tried to wait (a collector left the inline path)")

    async def step(self, now: float | None = None, *, final: bool = False) -> Batch | None:
        """Run the due collectors once; returns the batch spooled this tick, or None when the tick was held.

        Every tick's findings go to the ring buffer. A routine tick is held when ``stream.coalesce_ticks``
        allows (:class:`~sentinel.agent.outbox.Outbox`): its samples go out with the next batch spooled,
        which is then returned. ``final`` (the last tick before shutdown) never holds: it spools what is held,
        and also emits the Xids still waiting for their NVML/kernel twin: an Xid that lands just before
        SIGTERM must reach the spool, not die in the merge window.
        """
        now = self.clock() if now is None else now
        await self.collectors.run_due(now)
        flush_xids(self.sink, self.xids, math.inf if final else now)
        tick = self.sink.take()
        heads = fill_heads(
            tick.heads,
            host=self.host,
            procs=self.sink.procs(),
            gpus=self.gpus.keys(),
            note_rank=self.ranks.note,
        )
        batch = self.outbox.build(tick, heads, now)
        try:
            if self.health_enabled:
                self.health.apply(batch, now)
            self.counters.collector_success["health"] = True
        except Exception as exc:  # a rule bug must not stop the tick; health says "cannot tell" meanwhile
            self.counters.collector_success["health"] = False
            log.error("health_apply_failed", error=f"{type(exc).__name__}: {exc}")
        sent = self.outbox.keep(batch, heads, now, final=final)
        self.counters.last_tick = now
        self.counters.ticks += 1
        if self.shipper is not None:
            self.shipper.ready.set()
            if sent is not None:
                self.shipper.wake()
        return sent

    def render_metrics(self) -> bytes:
        """The /metrics body (text format): per-GPU series and the agent's own health."""
        return self.metrics.render(self.registry)

    # -- commands -------------------------------------------------------------------------------------------

    def snapshot(self, since: float | None = None) -> Snapshot:
        """The ring-buffer snapshot (see :mod:`sentinel.agent.ring`)."""
        return self.ring.snapshot(self.clock(), since)

    def trigger_fr_dump(self, job: str | None = None) -> FrDumpAnswer:
        """Ask the local ranks (of ``job``, or all) to dump their flight recorder."""
        return self.fr_dumps.trigger_fr_dump(job)

    def health_report(self) -> dict[str, Any]:
        """This node's fitness (``GET /api/v1/health``, ``sentinel health``): see :mod:`sentinel.agent.health`."""
        now = self.clock()
        open_errors = [
            f"{fn}: {err}" for (fn, err), n in self.counters.nvml_errors.items() if fn == "open" and n
        ]
        if self.gpu_collector is None:
            open_errors = ["the nvml collector is disabled in collect.disabled"]
        why_not = cannot_tell(
            self.gpu_collector is not None and self.gpu_collector.opened,
            "; ".join(open_errors),
            self.counters.last_tick,
            self.config.collect.tick_s,
            now,
        )
        if self.counters.collector_success.get("health") is False and not why_not:
            why_not = "the health rules failed on the last batch (see the agent's log)"
        gpus: list[tuple[int, str, str]] = [(i, v.info.uuid, v.state) for i, v in sorted(self.gpus.items())]
        return health_report(
            self.health,
            host=self.host,
            gpus=gpus,
            why_not=why_not,
            now=now,
            aggregator_connected=self.counters.connected,
        )

    async def handle_command(self, command: Command) -> CommandResult:
        """Answer a command from the aggregator through the command table (:mod:`sentinel.agent.commands`)."""
        return await dispatch(
            CommandTargets(
                snapshot=self.snapshot,
                fr_dumps=self.fr_dumps,
                health=self.health,
                clock=self.clock,
                evidence=self.evidence,
            ),
            command,
        )

    def _gpu_reads(self) -> dict[int, GpuReads]:
        return {i: GpuReads(info=v.info, fast=v.fast, slow=v.slow) for i, v in self.sink.gpus.items()}

    def _remap_rank(self, proc: ProcInfo) -> ProcInfo | None:
        return next(iter(self._evidence_mapper.map({proc.gpu: [proc.pid]})), None)

    def _evidence_problem(self, reason: str) -> None:
        self.counters.evidence_problems[reason] += 1

    def hello(self) -> Hello:
        """The hello this agent opens a stream with now (the shipper sends it on every (re)connect)."""
        return self._hello(-1)

    def _hello(self, first_pending: int) -> Hello:
        return Hello(
            host=self.host,
            cluster=self.cluster,
            agent_version=__version__,
            boot_id=self.boot_id,
            started_at=self.started_at,
            tick_s=self.config.collect.tick_s,
            gpus=self.inventory,
            next_seq=first_pending if first_pending >= 0 else self.seq.next,
            gpu_source=self.gpu_source,
            instance_id=self.instance_id,
        )

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open sockets and servers; the first tick opens the GPU source."""
        if self.probe is not None:
            try:
                await self.probe.start()
            except OSError as exc:
                log.error("probe_socket_failed", path=self.probe.path, error=exc.strerror or str(exc))
                self.probe = None
        if self.config.metrics.listen_host:
            try:
                self._http, self.http_port = await start_http(
                    self, self.config.metrics.listen_host, self.config.metrics.listen_port
                )
            except OSError as exc:
                log.error(
                    "metrics_listen_failed",
                    address=f"{self.config.metrics.listen_host}:{self.config.metrics.listen_port}",
                    error=exc.strerror or str(exc),
                )
        if self.shipper is not None:
            self._tasks.append(asyncio.create_task(self.shipper.run(), name=f"{self.host}-shipper"))

    def request_stop(self) -> None:
        self._stop.set()
        if self._nap is not None and not self._nap.done():
            self._nap.set_result(None)

    async def run(self) -> None:
        """Tick until :meth:`request_stop` (SIGTERM), then flush and close."""
        await self.start()
        loop = asyncio.get_running_loop()
        tick = self.config.collect.tick_s
        next_tick = loop.time()
        ready = False
        last_status = 0.0
        try:
            while not self._stop.is_set():
                try:
                    await self.step()
                except Exception as exc:  # the loop must survive anything a tick meets
                    log.error("tick_failed", error=f"{type(exc).__name__}: {exc}")
                if not ready:
                    self.notifier.ready(self.status_line())
                    ready = True
                if self.notifier.watchdog_s is not None:
                    self.notifier.watchdog()
                if loop.time() - last_status >= 10.0:
                    self.notifier.status(self.status_line())
                    last_status = loop.time()
                next_tick += tick
                delay = next_tick - loop.time()
                if delay < 0:
                    next_tick = loop.time()
                    delay = 0
                if not self._stop.is_set():
                    # a future the timer or request_stop ends: no cancellation (and its exceptions) a tick
                    self._nap = nap = loop.create_future()
                    timer = loop.call_later(delay, _end_nap, nap)
                    try:
                        await nap
                    finally:
                        timer.cancel()
                        self._nap = None
        finally:
            if len(self.xids) or self.outbox.held_ticks:
                try:
                    await self.step(final=True)
                except Exception as exc:
                    log.error("final_tick_failed", error=f"{type(exc).__name__}: {exc}")
            await self.shutdown()

    def status_line(self) -> str:
        states = [v.state for v in self.gpus.values()]
        bad = sum(1 for s in states if s != "ok")
        link = "connected" if self.counters.connected else "disconnected"
        spooled = len(self.spool) if self.spool is not None else 0
        return f"{len(states)} GPUs ({bad} not ok), aggregator {link}, {spooled} batches spooled"

    async def shutdown(self) -> None:
        """Give the stream a moment to deliver, keep the rest spooled on disk, release everything."""
        self.notifier.stopping()
        if self.shipper is not None:
            try:
                await self.shipper.drain(SHUTDOWN_DRAIN_S)
            finally:
                await self.shipper.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self.collectors.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.source.close), 2.0)
        except (TimeoutError, Exception) as exc:
            log.warning("gpu_source_close_failed", error=f"{type(exc).__name__}: {exc}")
        self.notifier.close()

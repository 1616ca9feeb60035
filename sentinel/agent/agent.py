"""The host agent: collectors → one batch per tick → ring buffer + spool → WebSocket; /metrics; commands.

``Agent(config, source, inputs=None, clock=time.time)`` takes its GPU source (and, for a simulated host, the
host's other OS boundaries: :class:`~sentinel.agent.source.HostInputs`) from the caller, so ``sentinel demo``
can run many agents in one process on simulated hosts::

    agents = [Agent(cfg_for(host), host, host.inputs(), clock) for host in sim.hosts]
    await asyncio.gather(*(a.run() for a in agents))      # each ticks, streams, serves its own registry
    for a in agents: a.request_stop()

``sentinel sim`` (virtual clock) builds them with ``inline=True`` (no thread, no event loop) and drives the
ticks itself: ``batch = agent.step_inline(now)``, then feeds the batch to the aggregator's engine in-process
(with ``stream.enabled = false``) after :meth:`Agent.hello` whenever the inventory changed.
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

import msgspec

from sentinel import __version__
from sentinel.agent.batch import (
    MAX_BATCH_BYTES,
    Encoded,
    TickFindings,
    build_batch,
    fill_heads,
    fit_frame,
)
from sentinel.agent.collectors import Collectors, GpuCollector, LineProcessor, flush_xids
from sentinel.agent.commands import dispatch
from sentinel.agent.frdump import MAX_COLLECT_BYTES, collect_dumps, trigger_fr_dump
from sentinel.agent.health import LocalHealth, cannot_tell
from sentinel.agent.health import report as health_report
from sentinel.agent.kmsg import current_boot_id
from sentinel.agent.metrics import AgentCounters, AgentMetricsCollector, GpuView, make_registry
from sentinel.agent.probe import ProbeServer
from sentinel.agent.registry import build_collectors
from sentinel.agent.ring import RingBuffer
from sentinel.agent.shipper import Shipper
from sentinel.agent.source import GpuSource, HostInputs
from sentinel.agent.spool import SeqAllocator, Spool, stream_instance
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.ib.kernel import PortLogLine
from sentinel.components.ib.metrics import IbPortMetrics
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.tracker import PortTracker
from sentinel.components.nccl_ras.metrics import RasMetrics
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.components.xid.merge import XidMerger
from sentinel.config.agent import AgentConfig
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.systemd import SystemdNotifier
from sentinel.wire import (
    Batch,
    Command,
    CommandResult,
    Drops,
    Event,
    FrDumpAnswer,
    GpuInfo,
    GpuSample,
    Hello,
    ProcInfo,
    ProcsMap,
    Snapshot,
)

log = get_logger(module="agent")

#: A simulated host's answer to fr_dump: it runs no PyTorch ranks, so there is no Flight Recorder to dump.
SIMULATED_NO_DUMP = "simulated host: runs no PyTorch ranks, so no flight-recorder dump to collect"
#: jobs whose local ranks (from probe heads) are remembered for fr_dump, oldest forgotten first
MAX_JOBS_REMEMBERED = 64
MAX_RANKS_REMEMBERED = 4096
SHUTDOWN_DRAIN_S = 3.0


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
        self.gpus: dict[int, GpuView] = {}
        self.inventory: list[GpuInfo] = []
        self.gpu_source: GpuSourceHealth | None = None
        self.pci_to_gpu: dict[str, int] = {}
        self.ring = RingBuffer(self.host, config.ring.window_s, config.ring.max_bytes)
        self.metrics = AgentMetricsCollector(self.cluster, self.host, self.gpus, self.counters)
        self.registry = make_registry(self.metrics)
        self.notifier = (
            notifier
            if notifier is not None
            else (SystemdNotifier() if config.systemd.notify else SystemdNotifier(env={}))
        )
        self._tick = TickFindings()
        self._procs: list[ProcInfo] = []
        self._ranks_by_job: dict[str, set[int]] = {}
        self._drops_reported = Drops()
        self._stop = asyncio.Event()
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
            wait_s=config.collect.xid_merge_wait_s, window_s=config.collect.xid_dedup_window_s
        )
        self.lines = LineProcessor(self, self.xids, forward_info=config.logs.forward_info)
        self.probe: ProbeServer | None = None
        self.gpu_collector: GpuCollector | None = None  # set by the registry's nvml entry (unless disabled)
        self.ib_metrics: IbPortMetrics | None = None  # set by the registry's ib entry
        self.ib_tracker: PortTracker | None = None  # set by the registry's ib entry (kernel port lines)
        self.ras_metrics: RasMetrics | None = None  # set by the registry's nccl_ras entry
        self.collectors = Collectors(self.counters, config.collect.tick_s, inline=inline)
        for collector in build_collectors(self):
            self.collectors.add(collector)

    # -- AgentSink ------------------------------------------------------------------------------------------

    def set_inventory(self, inventory: list[GpuInfo]) -> None:
        self.inventory = list(inventory)
        self.gpus.clear()
        for info in inventory:
            self.gpus[info.index] = GpuView(info)
        self.pci_to_gpu = {g.pci_bus: g.index for g in inventory if g.pci_bus}
        self.inventory_changes += 1
        self.health.hello(self._hello(-1), self.clock())
        if self.shipper is not None:
            self.shipper.request_reconnect()

    def add_sample(self, sample: GpuSample) -> None:
        self._tick.samples.append(sample)

    def add_event(self, event: Event) -> None:
        if not self._tick.add_event(event):
            self.counters.drop_parts["events_over_cap"] += 1

    def add_heads(self, heads: list[FrHeads]) -> None:
        self._tick.add_heads(heads)

    def procs(self) -> list[ProcInfo]:
        """The GPU processes of this host and their jobs, as last mapped (the probe checks senders against it)."""
        return self._procs

    def set_procs(self, procs: list[ProcInfo]) -> None:
        if procs != self._procs:
            self._procs = list(procs)
            self._tick.procs = self._procs
            for view in self.gpus.values():
                view.job, view.rank = "", ""
            for proc in procs:
                found = self.gpus.get(proc.gpu)
                if found is not None and proc.job_id and not found.job:
                    found.job = proc.job_id
                    found.rank = str(proc.rank) if proc.rank is not None else ""

    def set_ports(self, ports: list[IbPort]) -> None:
        self._tick.ports = ports

    def note_port_line(self, line: PortLogLine, now: float) -> None:
        if self.ib_tracker is not None:
            self.ib_tracker.note_kernel_line(line, now)

    def add_ras(self, status: RasStatus) -> None:
        self._tick.ras.append(status)

    def ras_jobs(self) -> list[str]:
        """Jobs whose global rank 0 runs here: this host asks NCCL RAS on the job's behalf."""
        return sorted({p.job_id for p in self._procs if p.job_id and p.rank == 0})

    def gpu_of_pid(self, pid: int) -> int | None:
        return next((p.gpu for p in self._procs if p.pid == pid), None)

    def set_gpu_source(self, health: GpuSourceHealth) -> None:
        """The GPU source's health changed (or was re-checked): the next batch and every hello carry it."""
        if health != self.gpu_source:
            self.gpu_source = health
            self._tick.gpu_source = health
            if not health.ok or health.found < health.expected:
                log.error(
                    "gpu_source_degraded", error=health.error, found=health.found, expected=health.expected
                )

    def nvml_error(self, function: str, error: str) -> None:
        self.counters.nvml_errors[(function, error)] += 1

    # -- one tick -------------------------------------------------------------------------------------------

    def _note_rank(self, job: str, rank: int) -> None:
        """Remember that ``rank`` of ``job`` reports from this host (fr_dump asks these ranks to dump)."""
        ranks = self._ranks_by_job.get(job)
        if ranks is None:
            if len(self._ranks_by_job) >= MAX_JOBS_REMEMBERED:
                self._ranks_by_job.pop(next(iter(self._ranks_by_job)))
            ranks = self._ranks_by_job[job] = set()
        if len(ranks) < MAX_RANKS_REMEMBERED:
            ranks.add(rank)

    def local_ranks(self, job: str | None) -> list[int]:
        """The ranks (of ``job``, or of every job) known to run here: process mapping and probe heads."""
        ranks = {p.rank for p in self._procs if p.rank is not None and (job is None or p.job_id == job)}
        for name, seen in self._ranks_by_job.items():
            if job is None or name == job:
                ranks.update(seen)
        return sorted(ranks)

    def step_inline(self, now: float) -> Batch:
        """One tick on the caller's thread, without an event loop (an ``inline`` agent: ``sentinel sim``).

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
            batch: Batch = done.value
            return batch
        coro.close()
        raise RuntimeError("an inline agent's tick tried to wait (a collector left the inline path)")

    async def step(self, now: float | None = None, *, final: bool = False) -> Batch:
        """Run the due collectors once and return this tick's batch (also kept in the ring and spooled).

        ``final`` (the last tick before shutdown) also emits the Xids still waiting for their NVML/kernel
        twin: an Xid that lands just before SIGTERM must reach the spool, not die in the merge window.
        """
        now = self.clock() if now is None else now
        await self.collectors.run_due(now)
        flush_xids(self, self.xids, math.inf if final else now)
        tick, self._tick = self._tick, TickFindings()
        heads = fill_heads(
            tick.heads, host=self.host, procs=self._procs, gpus=self.gpus.keys(), note_rank=self._note_rank
        )
        batch = build_batch(tick, heads, seq=self.seq.allocate(), now=now, drops=self._drops())
        try:
            if self.health_enabled:
                self.health.apply(batch, now)
            self.counters.collector_success["health"] = True
        except Exception as exc:  # a rule bug must not stop the tick; health says "cannot tell" meanwhile
            self.counters.collector_success["health"] = False
            log.error("health_apply_failed", error=f"{type(exc).__name__}: {exc}")
        ring = self.ring
        encoded = Encoded(
            samples=ring.extend("sample", [(sample.t, sample) for sample in batch.samples]),
            events=ring.extend("event", [(event.t, event) for event in batch.events]),
            heads=ring.extend("heads", [(now, h) for h in heads]),
        )
        if batch.procs is not None:
            ring.append(now, "procs", ProcsMap(procs=batch.procs))
        fitted = fit_frame(batch, MAX_BATCH_BYTES, encoded)
        if fitted.heads_cut or fitted.events_cut:
            self.counters.drop_parts["heads_oversize"] += fitted.heads_cut
            self.counters.drop_parts["events_oversize"] += fitted.events_cut
            log.warning(
                "batch_shrunk",
                seq=batch.seq,
                bytes=len(fitted.data),
                heads=len(fitted.batch.heads),
                events=len(fitted.batch.events),
            )
        batch = fitted.batch
        if self.spool is not None:
            self.spool.add(batch, fitted.data)
            self.counters.spool_bytes = self.spool.size_bytes
            self.counters.spool_write_errors = self.spool.write_errors
            self.counters.drop_parts["spool_samples"] = self.spool.dropped_samples
            self.counters.drop_parts["spool_events"] = self.spool.dropped_events
            self.counters.queue_depth["spool_batches"] = len(self.spool)
        self.counters.queue_depth["ring_entries"] = len(ring)
        self.counters.last_tick = now
        self.counters.ticks += 1
        if self.shipper is not None:
            self.shipper.ready.set()
            self.shipper.wake()
        return batch

    def _drops(self) -> Drops | None:
        """Drops since the last batch: the cumulative totals (also the metric) minus what was reported."""
        p = self.counters.drop_parts
        totals = Drops(
            samples=p["spool_samples"],
            events=p["spool_events"] + p["events_over_cap"] + p["events_oversize"],
            log_lines=p["log_lines_cut"],
            probe=p["probe_socket"] + p["heads_oversize"],
        )
        for what in ("samples", "events", "log_lines", "probe"):
            self.counters.dropped[what] = getattr(totals, what)
        last, self._drops_reported = self._drops_reported, totals
        delta = Drops(
            samples=totals.samples - last.samples,
            events=totals.events - last.events,
            log_lines=totals.log_lines - last.log_lines,
            probe=totals.probe - last.probe,
        )
        return None if delta == Drops() else delta

    def render_metrics(self) -> bytes:
        """The /metrics body (text format): per-GPU series and the agent's own health."""
        return self.metrics.render(self.registry)

    # -- commands -------------------------------------------------------------------------------------------

    def snapshot(self, since: float | None = None) -> Snapshot:
        """The ring-buffer snapshot (see :mod:`sentinel.agent.ring`)."""
        return self.ring.snapshot(self.clock(), since)

    def trigger_fr_dump(self, job: str | None = None) -> FrDumpAnswer:
        """Ask the local ranks (of ``job``, or all) to dump their flight recorder."""
        prefix = self.config.probe.fr_pipe_prefix
        return trigger_fr_dump(prefix, self.local_ranks(job) or None)

    def fr_dump_collect(
        self, job: str | None, *, since: float, wait_s: float, max_bytes: int = MAX_COLLECT_BYTES
    ) -> FrDumpAnswer:
        """Trigger the job's local ranks, then gather their fresh dumps (blocking; run off the loop).

        The trigger's answer plus ``dumps`` (gzip bytes per rank) and ``skipped`` — see
        :func:`sentinel.agent.frdump.collect_dumps`. Ranks are the job's known local ranks; when none is
        known, every pipe is triggered and every fresh dump in the folder is returned.
        """
        if self.inputs.simulated:  # a simulated host: its "job" is the simulator's, not PyTorch processes
            return FrDumpAnswer(error=SIMULATED_NO_DUMP)
        triggered = self.trigger_fr_dump(job)
        directory = self.config.probe.fr_dump_dir
        if not directory:
            return msgspec.structs.replace(triggered, error="probe.fr_dump_dir not set")
        known = self.local_ranks(job)
        found = collect_dumps(
            directory,
            self.config.probe.fr_dump_prefix,
            since=since,
            expect=triggered.triggered,
            ranks=known or None,
            wait_s=wait_s,
            max_bytes=max_bytes,
        )
        log.info(
            "fr_dump_collected",
            job=job,
            triggered=len(triggered.triggered),
            dumps=len(found.dumps),
            skipped=len(found.skipped),
            waited_s=found.waited_s,
        )
        return msgspec.structs.replace(
            triggered, dumps=found.dumps, skipped=found.skipped, waited_s=found.waited_s
        )

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
        return await dispatch(self, command)

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
            from sentinel.agent.http import start_http

            try:
                self._http, self.http_port = await start_http(self)
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
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
        finally:
            if len(self.xids):
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

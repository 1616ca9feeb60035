"""The agent's collectors, node_exporter style: each has a name and a cadence, and reports its duration and
success as the agent's own metrics (``sentinel_agent_collector_{duration_seconds,success}``).

A collector never raises out of :meth:`Collectors.run_due`: a failure is logged, counted as success=0, and
the next tick runs it again. Collectors write what they found into the agent through :class:`AgentSink`
(samples, events, processes, FR heads), which the agent turns into one batch per tick.

Inline mode (``Collectors(..., inline=True)``, ``sentinel sim``'s virtual clock) runs the same collectors
with no thread and no event loop: blocking calls run on the caller's thread (:class:`InlineWorker`; a
simulated hang is declared, not enacted), collectors run one after the other, and Xids are polled instead
of waited for. Every collector reads from the same boundary objects either way.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from sentinel.agent.classify import LineClassifier, log_line
from sentinel.agent.frdump import FrDumpWatcher
from sentinel.agent.jobs import JobMapper
from sentinel.agent.metrics import AgentCounters, GpuView
from sentinel.agent.probe import ProbeServer
from sentinel.agent.source import DatagramFeed, GpuLostError, GpuSource, KernelLog, LogLines, XidEvent
from sentinel.agent.worker import GpuWorker, InlineWorker, Unresponsive, Worker
from sentinel.components.bounds import MAX_SHORT_CHARS
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.ib.kernel import PortLogLine, port_log_line
from sentinel.components.nvml_read import GpuSourceDown
from sentinel.components.xid.merge import XidMerger, XidReport
from sentinel.components.xid.parse import xid_record
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import (
    MAX_TEXT_CHARS,
    Event,
    GpuInfo,
    GpuSample,
    GpuState,
    GpuStateChanged,
    GpuWasReset,
    ProcInfo,
    Severity,
    XidOccurred,
)

log = get_logger(module="agent.collectors")
T = TypeVar("T")


class AgentSink(Protocol):
    """What collectors feed: the agent under construction of this tick's batch."""

    host: str
    counters: AgentCounters
    gpus: dict[int, GpuView]
    pci_to_gpu: dict[str, int]

    def add_sample(self, sample: GpuSample) -> None: ...

    def add_event(self, event: Event) -> None: ...

    def set_procs(self, procs: list[ProcInfo]) -> None: ...

    def add_heads(self, heads: list[FrHeads]) -> None: ...

    def set_inventory(self, inventory: list[GpuInfo]) -> None: ...

    def gpu_of_pid(self, pid: int) -> int | None: ...

    def nvml_error(self, function: str, error: str) -> None: ...

    def set_gpu_source(self, health: GpuSourceHealth) -> None: ...

    def note_port_line(self, line: PortLogLine, now: float) -> None:
        """A kernel line about an IB/RoCE port (evidence for the ib component's port records)."""
        ...


class Collector(abc.ABC):
    """Base: ``name``, ``interval_s``; subclasses implement :meth:`collect`.

    Blocking file-system work goes through :meth:`blocking`: a worker thread of this collector with a
    deadline. Reading /proc/<pid>/environ of a process stuck in the GPU driver, or a log file on a hung NFS
    mount, can block for good; the collector then reports failure each tick while its thread stays stuck,
    instead of freezing the tick (and, through the systemd watchdog, restarting the agent into the same hang).
    """

    name = "collector"
    blocking_deadline_s = 5.0

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.next_run = 0.0
        #: set by :class:`Collectors` in inline mode: blocking calls run on the caller's thread
        self.inline = False
        self._worker: Worker | None = None

    @abc.abstractmethod
    async def collect(self, now: float) -> None:
        """Read this collector's source once and record what it found."""

    def new_worker(self, name: str) -> Worker:
        """A worker for blocking calls: a thread with a deadline, or inline under the virtual clock."""
        return InlineWorker(name) if self.inline else GpuWorker(name)

    async def blocking(self, fn: Callable[[], T]) -> T:
        if self._worker is None:
            self._worker = self.new_worker(f"collector-{self.name}")
        return await self._worker.call(fn, self.blocking_deadline_s)

    def close(self) -> None:
        """Release files/sockets/threads."""
        if self._worker is not None:
            self._worker.stop()


class Collectors:
    """Runs every due collector of a tick concurrently (inline: one after the other) and records
    duration/success."""

    def __init__(self, counters: AgentCounters, tick_s: float, *, inline: bool = False) -> None:
        self.counters = counters
        self.tick_s = tick_s
        self.inline = inline
        self.items: list[Collector] = []

    def add(self, collector: Collector) -> None:
        collector.inline = self.inline
        self.items.append(collector)

    def get(self, name: str) -> Collector | None:
        return next((c for c in self.items if c.name == name), None)

    async def run_due(self, now: float, *, first: tuple[str, ...] = ("nvml",)) -> None:
        # a collector on the tick's own cadence runs every tick, however late or early the loop woke up
        due = [c for c in self.items if c.interval_s <= self.tick_s or now >= c.next_run]
        leading = [c for c in due if c.name in first]
        rest = [c for c in due if c.name not in first]
        for group in (leading, rest):
            if self.inline:
                for collector in group:
                    await self._run(collector, now)
            elif group:
                await asyncio.gather(*(self._run(c, now) for c in group))

    async def _run(self, collector: Collector, now: float) -> None:
        started = time.perf_counter()
        ok = True
        try:
            await collector.collect(now)
        except Exception as exc:
            ok = False
            log.warning("collector_failed", collector=collector.name, error=f"{type(exc).__name__}: {exc}")
        self.counters.collector_duration[collector.name] = time.perf_counter() - started
        self.counters.collector_success[collector.name] = ok
        # half a tick of slack so a collector whose interval equals the tick runs on every tick
        collector.next_run = now + collector.interval_s - self.tick_s / 2

    def close(self) -> None:
        for collector in self.items:
            try:
                collector.close()
            except Exception as exc:
                log.warning("collector_close_failed", collector=collector.name, error=str(exc))


class GpuCollector(Collector):
    """Per-GPU NVML reads, each in its own worker thread with a deadline; slow counters on their cadence."""

    name = "nvml"

    #: re-initialisation backoff: doubles from the slow tick up to this
    MAX_BACKOFF_S = 300.0

    def __init__(
        self,
        sink: AgentSink,
        source: GpuSource,
        *,
        tick_s: float,
        slow_tick_s: float,
        timeout_s: float,
        expected_gpus: int = 0,
        expected_path: Path | None = None,
    ) -> None:
        super().__init__(tick_s)
        self.sink = sink
        self.source = source
        self.slow_tick_s = slow_tick_s
        self.timeout_s = timeout_s
        self.opened = False
        self._opener: Worker | None = None
        self._workers: dict[int, Worker] = {}
        self._next_slow = 0.0
        self._next_open = 0.0
        self._backoff = slow_tick_s
        self.on_open: Callable[[], None] | None = None
        self.expected_path = expected_path
        self.expected = expected_gpus or _load_expected(expected_path)
        self.opens = 0
        self._lost_uuids: set[str] = set()  # GPUs lost before a re-initialisation (back = reset)

    @property
    def _open_worker(self) -> Worker:
        """The worker for open/close (made on first use: inline mode is set after construction)."""
        if self._opener is None:
            self._opener = self.new_worker(f"{self.sink.host}-nvml-open")
        return self._opener

    def _health(self, error: str = "") -> None:
        found = sum(1 for v in self.sink.gpus.values() if v.state != "unavailable") if not error else 0
        self.sink.set_gpu_source(
            GpuSourceHealth(ok=not error, error=error[:500], expected=self.expected, found=found)
        )

    async def _open(self, now: float) -> bool:
        if now < self._next_open:
            return False
        try:
            inventory = await self._open_worker.call(self.source.open, max(self.timeout_s * 4, 5.0))
        except Exception as exc:
            error = "NVML open timed out" if isinstance(exc, Unresponsive) else f"{type(exc).__name__}: {exc}"
            log.error("gpu_source_open_failed", host=self.sink.host, error=error, retry_in_s=self._backoff)
            self.sink.nvml_error(
                "open", "timeout" if isinstance(exc, Unresponsive) else type(exc).__name__.lower()
            )
            self._next_open = now + self._backoff
            self._backoff = min(self._backoff * 2, self.MAX_BACKOFF_S)
            self._health(error)
            return False
        self._backoff = self.slow_tick_s
        self.opens += 1
        self.sink.set_inventory(inventory)
        for info in inventory:
            if info.error:
                self._transition(info.index, "unavailable", now, f"GPU {info.index}: {info.error}")
            elif info.uuid and info.uuid in self._lost_uuids:
                self._reset_seen(info.index, now)
        self._lost_uuids.clear()
        self._workers = {
            g.index: self.new_worker(f"{self.sink.host}-gpu{g.index}") for g in inventory if not g.error
        }
        self.opened = True
        if not self.expected and inventory:
            self.expected = len(inventory)  # learned from the first inventory, kept across restarts
            _save_expected(self.expected_path, self.expected)
        self._health()
        if self.opens == 1 and self.on_open is not None:
            self.on_open()
        log.info("gpus_found", count=len(inventory), expected=self.expected, host=self.sink.host)
        return True

    async def _reinit(self, now: float, why: str) -> None:
        """NVML as a whole went away (driver reload, reset): close it and open again after a backoff."""
        log.warning("gpu_source_reinit", host=self.sink.host, reason=why, retry_in_s=self._backoff)
        self._lost_uuids = {v.info.uuid for v in self.sink.gpus.values() if v.state == "lost" and v.info.uuid}
        for worker in self._workers.values():
            worker.stop()
        self._workers = {}
        self.opened = False
        try:
            await self._open_worker.call(self.source.close, max(self.timeout_s * 4, 5.0))
        except Exception as exc:
            log.warning("gpu_source_close_failed", error=f"{type(exc).__name__}: {exc}")
        self._next_open = now + self._backoff
        self._health(why)

    def _reset_seen(self, index: int, now: float) -> None:
        self.sink.add_event(
            GpuWasReset(
                t=now,
                source="nvml",
                gpu=index,
                severity="info",
                text=f"GPU {index} answers again after NVML re-initialisation (it was lost): it was reset",
            )
        )

    async def collect(self, now: float) -> None:
        if not self.opened and not await self._open(now):
            raise RuntimeError("GPU source not open")
        slow = now >= self._next_slow
        if slow:
            self._next_slow = now + self.slow_tick_s - self.interval_s / 2
        for index, view in sorted(self.sink.gpus.items()):
            if view.state == "unavailable":
                self.sink.add_sample(GpuSample(gpu=index, t=now, state="unavailable"))
        if self.inline:
            results = [await self._read(index, now, slow) for index in sorted(self._workers)]
        else:
            results = await asyncio.gather(*(self._read(i, now, slow) for i in sorted(self._workers)))
        down = next((r for r in results if r), "")
        if not down and slow:
            views = [v for v in self.sink.gpus.values() if v.state != "unavailable"]
            if views and all(v.state == "lost" for v in views):
                down = "every GPU is lost"
        if down:
            await self._reinit(now, down)
            raise RuntimeError(f"GPU source down: {down}")

    async def _read(self, index: int, now: float, slow: bool) -> str:
        """Read one GPU; returns why NVML as a whole is down, if this read found it so."""
        view = self.sink.gpus[index]
        if view.state == "lost" and not slow:
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="lost"))
            return ""
        read = self.source.read_slow if slow else self.source.read_fast
        try:
            sample = await self._workers[index].call(lambda: read(index, now), self.timeout_s)
        except GpuSourceDown as exc:
            return str(exc)
        except GpuLostError as exc:
            self._transition(index, "lost", now, str(exc))
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="lost"))
            return ""
        except Unresponsive as exc:
            self._transition(index, "unresponsive", now, str(exc))
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="unresponsive"))
            return ""
        except Exception as exc:
            self.sink.nvml_error("read_slow" if slow else "read_fast", type(exc).__name__.lower())
            raise
        if view.state != "ok":
            self._transition(index, "ok", now, "")
        sample.state = "ok"
        view.fast = sample
        if slow:
            view.slow = sample
        self.sink.add_sample(sample)
        return ""

    def _transition(self, index: int, state: GpuState, now: float, detail: str) -> None:
        view = self.sink.gpus[index]
        if view.state == state:
            return
        previous, view.state = view.state, state
        severity: Severity = "info" if state == "ok" else "critical"
        log.warning("gpu_state", gpu=index, state=state, previous=previous, detail=detail)
        self.sink.add_event(
            GpuStateChanged(
                t=now,
                source="nvml",
                gpu=index,
                severity=severity,
                text=(detail or f"GPU {index} answers again (was {previous})")[:MAX_TEXT_CHARS],
                state=state,
                previous=previous,
            )
        )

    def close(self) -> None:
        super().close()
        for worker in self._workers.values():
            worker.stop()
        if self._opener is not None:
            self._opener.stop()


class XidListener:
    """A dedicated daemon thread blocked in ``wait_xid_events`` (nvmlEventSetWait), feeding a bounded queue.

    Inline (the virtual clock) there is no thread: each :meth:`drain` asks the source without waiting.
    """

    def __init__(
        self,
        source: GpuSource,
        name: str,
        timeout_s: float = 1.0,
        max_pending: int = 10000,
        *,
        inline: bool = False,
    ) -> None:
        self.source = source
        self.timeout_s = timeout_s
        self.inline = inline
        self._pending: collections.deque[XidEvent] = collections.deque(maxlen=max_pending)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.errors = 0

    def start(self) -> None:
        if not self.inline:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.source.wait_xid_events(self.timeout_s)
            except Exception as exc:
                self.errors += 1
                if self.errors <= 5:
                    log.warning("xid_wait_failed", error=f"{type(exc).__name__}: {exc}")
                self._stop.wait(self.timeout_s)
                continue
            self._pending.extend(events)

    def drain(self) -> list[XidEvent]:
        if self.inline:
            try:
                self._pending.extend(self.source.wait_xid_events(0.0))
            except Exception as exc:
                self.errors += 1
                if self.errors <= 5:
                    log.warning("xid_wait_failed", error=f"{type(exc).__name__}: {exc}")
        out: list[XidEvent] = []
        while self._pending:
            out.append(self._pending.popleft())
        return out

    def stop(self) -> None:
        self._stop.set()


class XidCollector(Collector):
    """Xids from the source's event set, deduplicated against the kernel log."""

    name = "xid"

    def __init__(self, sink: AgentSink, listener: XidListener, merger: XidMerger, tick_s: float) -> None:
        super().__init__(tick_s)
        self.sink = sink
        self.listener = listener
        self.merger = merger

    async def collect(self, now: float) -> None:
        for xid in self.listener.drain():
            record_xid(
                self.sink, self.merger, XidReport(gpu=xid.gpu, xid=xid.xid, t=xid.t, source="nvml"), now
            )

    def close(self) -> None:
        super().close()
        self.listener.stop()


def record_xid(sink: AgentSink, merger: XidMerger, report: XidReport, now: float) -> None:
    """Offer one Xid report (NVML or kernel log) to the merger; emit whatever became ready."""
    for ready in merger.offer(report, now):
        emit_xid(sink, ready)


def flush_xids(sink: AgentSink, merger: XidMerger, now: float) -> None:
    """Emit the reports whose wait for their twin is over (called once per tick)."""
    for ready in merger.due(now):
        emit_xid(sink, ready)


def emit_xid(sink: AgentSink, report: XidReport) -> None:
    """One Xid event carrying its classified record: the kernel line's parse, else the catalog's entry."""
    text = report.text or f"NVML Xid {report.xid} on GPU {report.gpu}"
    record = xid_record(report.xid, text if report.from_kernel else "", report.pci_bus or None)
    sink.counters.xid[(report.gpu, report.xid, record.severity)] += 1
    sink.add_event(
        XidOccurred(
            t=report.t,
            source=report.source,
            gpu=report.gpu if report.gpu >= 0 else None,
            severity=record.severity,
            text=text[:MAX_TEXT_CHARS],
            record=record,
            merged=report.merged,
        )
    )


class LineProcessor:
    """Turns kernel and job log lines into events (classified by the signals package)."""

    KERNEL_KINDS = frozenset({"xid", "row_remap", "ecc"})

    def __init__(self, sink: AgentSink, merger: XidMerger, *, forward_info: bool = False) -> None:
        self.sink = sink
        self.merger = merger
        self.forward_info = forward_info
        self.classify = LineClassifier()

    def kernel(self, message: str, now: float, source: str = "kmsg") -> None:
        result = self.classify(message)
        if result is None:
            return
        self.sink.counters.log_events[(result.kind, result.severity)] += 1
        xid = result.fields.get("xid")
        pci = result.fields.get("pci_bus")
        gpu = self.sink.pci_to_gpu.get(pci, -1) if isinstance(pci, str) else -1
        if result.kind == "xid" and isinstance(xid, int):
            report = XidReport(
                gpu=gpu,
                xid=xid,
                t=now,
                source=source,
                text=message,
                pci_bus=pci if isinstance(pci, str) else "",
            )
            record_xid(self.sink, self.merger, report, now)
            return
        port_line = port_log_line(message, result.fields.get("reason"))
        if port_line is not None:
            self.sink.note_port_line(port_line, now)
        if result.kind in self.KERNEL_KINDS or result.severity != "info":
            self._event(
                result.kind,
                severity=result.severity,
                fields=result.fields,
                text=message,
                now=now,
                source=source,
                gpu=gpu,
            )

    def job(self, line: str, now: float, source: str) -> None:
        result = self.classify(line)
        if result is None:
            return
        self.sink.counters.log_events[(result.kind, result.severity)] += 1
        if result.severity == "info" and not self.forward_info:
            return
        pci = result.fields.get("pci_bus")
        gpu = self.sink.pci_to_gpu.get(pci, -1) if isinstance(pci, str) else -1
        pid = result.fields.get("pid")
        if gpu < 0 and isinstance(pid, int) and not isinstance(pid, bool):
            found = self.sink.gpu_of_pid(pid)  # the NCCL line's pid is a rank process on one of our GPUs
            gpu = found if found is not None else -1
        self._event(
            result.kind,
            severity=result.severity,
            fields=result.fields,
            text=line,
            now=now,
            source=source,
            gpu=gpu,
        )

    def _event(
        self,
        kind: str,
        *,
        severity: str,
        fields: dict[str, str | int | float | bool | None],
        text: str,
        now: float,
        source: str,
        gpu: int,
    ) -> None:
        self.sink.add_event(
            log_line(
                fields,
                line_kind=kind,
                t=now,
                source=source[:MAX_SHORT_CHARS],
                gpu=gpu if gpu >= 0 else None,
                severity=_severity(severity),
                text=text[:MAX_TEXT_CHARS],
            )
        )


class KmsgCollector(Collector):
    name = "kmsg"

    def __init__(self, reader: KernelLog, lines: LineProcessor, tick_s: float) -> None:
        super().__init__(tick_s)
        self.reader = reader
        self.lines = lines

    async def collect(self, now: float) -> None:
        records = self.reader.poll(now)
        for record in records:
            self.lines.kernel(record.message, now)
        if records:
            self.reader.save_cursor()  # after the lines are in this tick's batch
        if self.reader.open_errors and not self.reader.is_open:
            raise PermissionError(f"{self.reader.path}: cannot be opened (see the log)")

    def close(self) -> None:
        super().close()
        self.reader.close()


class LogCollector(Collector):
    name = "logs"

    def __init__(
        self, tailer: LogLines, lines: LineProcessor, counters: AgentCounters, tick_s: float
    ) -> None:
        super().__init__(tick_s)
        self.tailer = tailer
        self.lines = lines
        self.counters = counters

    async def collect(self, now: float) -> None:
        found = await self.blocking(lambda: self.tailer.poll(now))
        for path, line in found:
            self.lines.job(line, now, f"log:{path}")
        self.counters.drop_parts["log_lines_cut"] = self.tailer.cut_lines
        self.counters.drop_parts["log_files_refused"] = self.tailer.refused_files
        self.counters.queue_depth["log_files"] = len(self.tailer.files)

    def close(self) -> None:
        super().close()
        if self._worker is None or not self._worker.busy:
            self.tailer.close()


class JobsCollector(Collector):
    """Maps the pids NVML sees on each GPU to jobs and ranks (psutil, off the loop)."""

    name = "jobs"

    def __init__(self, sink: AgentSink, mapper: JobMapper, interval_s: float) -> None:
        super().__init__(interval_s)
        self.sink = sink
        self.mapper = mapper

    async def collect(self, now: float) -> None:
        pids = {
            i: list(v.fast.pids) for i, v in self.sink.gpus.items() if v.fast is not None and v.state == "ok"
        }
        procs = await self.blocking(lambda: self.mapper.map(pids))
        self.sink.set_procs(procs)


class ProbeCollector(Collector):
    """FR heads the probe socket received this tick (a simulated host's datagrams go through the same
    validation and authorisation first)."""

    name = "probe"

    def __init__(
        self, sink: AgentSink, server: ProbeServer, tick_s: float, feed: DatagramFeed | None = None
    ) -> None:
        super().__init__(tick_s)
        self.sink = sink
        self.server = server
        self.feed = feed

    async def collect(self, now: float) -> None:
        if self.feed is not None:
            for data, creds in self.feed.receive(now):
                self.server.receive(data, creds)
        self.sink.counters.queue_depth["probe"] = len(self.server)
        self.sink.add_heads(self.server.drain())
        self.sink.counters.drop_parts["probe_socket"] = self.server.rejected + self.server.overflowed

    def close(self) -> None:
        super().close()
        self.server.close()


class FrDumpCollector(Collector):
    name = "fr_dumps"

    def __init__(self, sink: AgentSink, watcher: FrDumpWatcher, interval_s: float) -> None:
        super().__init__(interval_s)
        self.sink = sink
        self.watcher = watcher

    async def collect(self, now: float) -> None:
        for event in await self.blocking(lambda: self.watcher.poll(now)):
            self.sink.add_event(event)


def _load_expected(path: Path | None) -> int:
    """The GPU count learned from this host's first inventory (0 when never learned)."""
    if path is None:
        return 0
    try:
        value = int(path.read_text().strip()[:8])
    except (OSError, ValueError):
        return 0
    return value if 0 < value <= 1024 else 0


def _save_expected(path: Path | None, count: int) -> None:
    if path is None:
        return
    try:
        path.write_text(f"{count}\n")
    except OSError as exc:
        log.warning("expected_gpus_save_failed", path=str(path), error=exc.strerror or str(exc))


def _severity(value: str) -> Severity:
    if value == "critical":
        return "critical"
    if value == "warning":
        return "warning"
    return "info"

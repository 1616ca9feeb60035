"""The ``xid`` collector: Xids from the GPU source's event set, merged with their kernel-log twins.

A dedicated thread waits in ``nvmlEventSetWait`` (inline: polled without waiting); every Xid report, from
NVML or from the kernel log, goes through the :class:`XidMerger`, and what it releases becomes one
``XidOccurred`` event carrying its classified record.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import replace

from sentinel.agent.collectors.base import AgentSink
from sentinel.agent.source import GpuSource, XidEvent
from sentinel.components.collector import Collector
from sentinel.components.xid.merge import XidMerger, XidReport
from sentinel.components.xid.parse import XidRecord, xid_record
from sentinel.log import get_logger
from sentinel.wire import MAX_TEXT_CHARS, XidOccurred

log = get_logger(module="agent.collectors")


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
        emit_xid(sink, merger, ready)


def flush_xids(sink: AgentSink, merger: XidMerger, now: float) -> None:
    """Emit the reports whose wait for their twin is over, and the repeats of floods whose window ended
    (called once per tick)."""
    for ready in merger.due(now):
        emit_xid(sink, merger, ready)
    for last, repeats in merger.flood.due(now):
        send_xid(sink, replace(last, count=repeats))


def emit_xid(sink: AgentSink, merger: XidMerger, report: XidReport) -> None:
    """One Xid occurrence: sent at once, unless it repeats a line of its GPU within the flood window, where
    it is counted into the flood's next event."""
    text = report.text or f"NVML Xid {report.xid} on GPU {report.gpu}"
    record = xid_record(report.xid, text if report.from_kernel else "", report.pci_bus or None)
    sink.counters.xid[(report.gpu, report.xid, record.severity)] += 1
    send, pushed = merger.flood.offer((report.gpu, report.xid, record.pid, record.message), report, report.t)
    for last, repeats in pushed:
        send_xid(sink, replace(last, count=repeats))
    if send:
        send_xid(sink, report, record)


def send_xid(sink: AgentSink, report: XidReport, record: XidRecord | None = None) -> None:
    """One Xid event carrying its classified record: the kernel line's parse, else the catalog's entry."""
    text = report.text or f"NVML Xid {report.xid} on GPU {report.gpu}"
    if record is None:
        record = xid_record(report.xid, text if report.from_kernel else "", report.pci_bus or None)
    sink.add_event(
        XidOccurred(
            t=report.t,
            source=report.source,
            gpu=report.gpu if report.gpu >= 0 else None,
            severity=record.severity,
            text=text[:MAX_TEXT_CHARS],
            record=record,
            merged=report.merged,
            count=report.count,
        )
    )

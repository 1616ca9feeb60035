"""The log-line collectors: the kernel log (``kmsg``) and the jobs' log files (``logs``).

Both hand each line to :class:`LineProcessor`, which classifies it once (:mod:`sentinel.agent.classify`)
and turns it into an event: an NVRM Xid goes to the Xid merger, a kernel line about an IB/RoCE port is
noted as evidence for the port's records, and NCCL / PyTorch lines are matched to a GPU by PCI bus or pid.
"""

from __future__ import annotations

from sentinel.agent.classify import LineClassifier, log_line
from sentinel.agent.collectors.base import AgentSink
from sentinel.agent.collectors.xid import record_xid
from sentinel.agent.kernel_window import KernelWindow
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.source import KernelLog, LogLines
from sentinel.components.bounds import MAX_SHORT_CHARS
from sentinel.components.collector import Collector
from sentinel.components.ib.kernel import port_log_line
from sentinel.components.xid.merge import XidMerger, XidReport
from sentinel.wire import MAX_TEXT_CHARS, Severity


class LineProcessor:
    """Turns kernel and job log lines into events (classified by the signals package)."""

    KERNEL_KINDS = frozenset({"xid", "row_remap", "ecc"})

    def __init__(
        self,
        sink: AgentSink,
        merger: XidMerger,
        *,
        forward_info: bool = False,
        recent: KernelWindow | None = None,
    ) -> None:
        self.sink = sink
        #: every kernel line, classified or not, for incident evidence
        self.recent = recent
        self.merger = merger
        self.forward_info = forward_info
        self.classify = LineClassifier()

    def kernel(self, message: str, now: float, source: str = "kmsg") -> None:
        if self.recent is not None:
            self.recent.note(now, message)
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


def _severity(value: str) -> Severity:
    if value == "critical":
        return "critical"
    if value == "warning":
        return "warning"
    return "info"

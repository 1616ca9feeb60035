"""One Xid occurrence reported twice — by NVML's event set and by the kernel log — becomes one event.

The two reports race: NVML's event usually arrives first but carries only (GPU, code); the kernel line has
the detail that policy needs (pid and process for the distinct-process rule, the text with "Nonfatal" or
"recovery action None" that makes an NVLink5 Xid 149 or an Xid 154 a warning, sub-codes). Taking the first
copy loses that detail. So a report waits up to ``wait_s`` for its twin; the merged event keeps the kernel
line's text and fields and NVML's time (the driver's own timestamp, not when a log reader got to it). A
report whose twin never comes is emitted alone when its wait is over; a twin arriving after that (within
``window_s``) is recognised and dropped, never a second event.

Pure: time is passed in, so the agent's tick, the simulator and tests share it. Bounded: at most
``max_pending`` reports wait (beyond, the oldest is emitted at once) and ``max_recent`` are remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from sentinel.components.xid.flood import XidFlood

Source = str  # "nvml" or a kernel-log source ("kmsg")


@dataclass(frozen=True, slots=True)
class XidReport:
    gpu: int  # -1 when the kernel line's PCI address is not one of this host's GPUs
    xid: int
    t: float
    source: Source
    text: str = ""
    pci_bus: str = ""
    #: both sources reported it (set on the merged event)
    merged: bool = False
    #: occurrences it stands for (a flood's repeats, counted by :class:`~sentinel.components.xid.flood.XidFlood`)
    count: int = 1

    @property
    def from_kernel(self) -> bool:
        return self.source != "nvml"


class XidMerger:
    def __init__(
        self,
        *,
        wait_s: float = 2.0,
        window_s: float = 10.0,
        max_pending: int = 1024,
        max_recent: int = 4096,
        flood_window_s: float = 10.0,
    ) -> None:
        #: what the merged reports go through next: a flood of one Xid becomes one report per window
        self.flood: XidFlood[XidReport] = XidFlood(window_s=flood_window_s)
        self.wait_s = wait_s
        self.window_s = max(window_s, wait_s)
        self.max_pending = max_pending
        self.max_recent = max_recent
        self._pending: OrderedDict[tuple[int, int], tuple[float, XidReport]] = OrderedDict()
        #: (gpu, xid) → (time, from_kernel) of the last emitted occurrence, to drop its late twin
        self._recent: OrderedDict[tuple[int, int], tuple[float, bool]] = OrderedDict()
        self.merged = 0
        self.late_twins = 0
        self.alone = 0

    def offer(self, report: XidReport, now: float) -> list[XidReport]:
        """Take one report; returns what is ready now (a merged pair, or reports pushed out by the bound)."""
        key = (report.gpu, report.xid)
        waiting = self._pending.get(key)
        if waiting is not None and waiting[1].from_kernel != report.from_kernel:
            del self._pending[key]
            self.merged += 1
            return [self._emit(_merge(waiting[1], report))]
        recent = self._recent.get(key)
        if (
            recent is not None
            and recent[1] != report.from_kernel
            and abs(report.t - recent[0]) <= self.window_s
            and report.gpu >= 0
        ):
            self.late_twins += 1
            del self._recent[key]  # one twin per occurrence: a third report is a new occurrence
            return []
        out: list[XidReport] = []
        if waiting is not None:  # the same source again: the waiting one is a separate occurrence
            del self._pending[key]
            out.append(self._emit(waiting[1]))
        if report.gpu < 0:
            out.append(self._emit(report))  # no GPU to match NVML's report against: nothing to wait for
            return out
        self._pending[key] = (now + self.wait_s, report)
        while len(self._pending) > self.max_pending:
            _, (_, oldest) = self._pending.popitem(last=False)
            self.alone += 1
            out.append(self._emit(oldest))
        return out

    def due(self, now: float) -> list[XidReport]:
        """Reports whose wait is over, emitted alone."""
        out = []
        for key, (deadline, report) in list(self._pending.items()):
            if deadline <= now:
                del self._pending[key]
                self.alone += 1
                out.append(self._emit(report))
        return out

    def __len__(self) -> int:
        return len(self._pending)

    def _emit(self, report: XidReport) -> XidReport:
        key = (report.gpu, report.xid)
        if not report.merged:
            self._recent[key] = (report.t, report.from_kernel)
            self._recent.move_to_end(key)
            while len(self._recent) > self.max_recent:
                self._recent.popitem(last=False)
        else:
            self._recent.pop(key, None)
        return report


def _merge(a: XidReport, b: XidReport) -> XidReport:
    kernel, nvml = (a, b) if a.from_kernel else (b, a)
    return replace(kernel, t=nvml.t, merged=True, pci_bus=kernel.pci_bus)

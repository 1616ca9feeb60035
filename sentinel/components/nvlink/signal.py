"""The nvlink signal: NVLink error counters climbing faster than a threshold, naming the links that rose."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sentinel.components.nvlink import metrics, nvml
from sentinel.components.nvlink.record import NvLink
from sentinel.components.nvlink.rule import error_total, evaluate_error_rate, rises
from sentinel.components.nvml_read import FieldRequest
from sentinel.components.rates import Reading, counter_rate, record_change
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead, judged
from sentinel.wire import GpuSample


class NvlinkMemory(msgspec.Struct, kw_only=True):
    """The error total's changes and latest reading, the links as last read, and which rose at the latest
    change (evidence: which cable or switch port)."""

    hist: list[Reading] = []
    prev: Reading | None = None
    last: list[NvLink] | None = None
    rose: tuple[str, ...] = ()


def remember(memory: NvlinkMemory | None, sample: GpuSample) -> tuple[NvlinkMemory, bool] | None:
    links = sample.nvlink
    if links is None:
        return None
    mem = memory if memory is not None else NvlinkMemory()
    prev = mem.prev
    if links is mem.last:
        if prev is not None:
            mem.prev = (sample.t, prev[1])  # same readings as before: only the time moves on
        return mem, False
    total = error_total(links)
    changed = False
    if prev is None or prev[1] != total:
        record_change(mem.hist, prev, sample.t, total)
        changed = prev is not None
        if prev is not None and mem.last is not None:
            mem.rose = rises(mem.last, links)
    mem.last = links
    mem.prev = (sample.t, total)
    return mem, changed


def error_rate(memory: NvlinkMemory | None, window_s: float) -> float:
    """The GPU's NVLink error rate per second (0 before two readings): also the stuck and straggler
    detectors' evidence for a slow or stalled rank."""
    if memory is None or memory.prev is None:
        return 0.0
    return counter_rate(memory.hist, memory.prev, window_s)


def judge(gpu: GpuFacts, memory: NvlinkMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.prev is None:
        return []
    rate = error_rate(memory, settings.rate_window_s)
    return judged(evaluate_error_rate(rate, settings.nvlink_errors_per_s, memory.rose), memory.prev[0])


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.nvlink = nvml.read(read.get, read.gpu, read.handle, list(read.links), read.values)


def _fields(links: Sequence[int]) -> list[FieldRequest]:
    return nvml.field_requests(list(links))


SIGNAL = Signal[NvlinkMemory](
    name="nvlink",
    summary="NVLink state and error counters: links down, error rates",
    nvml=NvmlRead(slow=_slow, fields=_fields),
    memory_type=NvlinkMemory,
    reads=("nvlink",),
    remember=remember,
    judge=judge,
    precedence=60,
    render=metrics.render,
)

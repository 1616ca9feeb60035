"""The rowremap signal: pending remaps that need a reset, remap failures that need an RMA."""

from __future__ import annotations

import msgspec

from sentinel.components.rowremap import metrics, nvml
from sentinel.components.rowremap.parse import parse_row_remap
from sentinel.components.rowremap.record import RowRemap
from sentinel.components.rowremap.rule import evaluate_row_remap
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead
from sentinel.wire import GpuSample


class RemapMemory(msgspec.Struct, kw_only=True):
    """The latest reading, the one before its latest change (to see a rise; none after a reset), and when
    it changed."""

    cur: RowRemap | None = None
    prev: RowRemap | None = None
    t: float = 0.0


def remember(memory: RemapMemory | None, sample: GpuSample) -> tuple[RemapMemory, bool] | None:
    remap = sample.remap
    if remap is None or (memory is not None and (remap is memory.cur or remap == memory.cur)):
        return None
    if memory is None:
        return RemapMemory(cur=remap, t=sample.t), True
    memory.prev, memory.cur, memory.t = memory.cur, remap, sample.t
    return memory, True


def on_reset(memory: RemapMemory, t: float) -> RemapMemory:
    memory.prev = None  # rises are judged from the reset on
    return memory


def judge(gpu: GpuFacts, memory: RemapMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.cur is None:
        return []
    finding = evaluate_row_remap(memory.cur, memory.prev)
    return [Judged(finding, memory.t)] if finding.state != "ok" else []


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.remap = nvml.read(read.get, read.gpu, read.handle)


SIGNAL = Signal[RemapMemory](
    name="rowremap",
    summary="row remapping: pending remaps that need a reset, remap failures that need an RMA",
    nvml=NvmlRead(slow=_slow),
    parse=parse_row_remap,
    memory_type=RemapMemory,
    remember=remember,
    on_reset=on_reset,
    judge=judge,
    precedence=40,
    render=metrics.render,
)

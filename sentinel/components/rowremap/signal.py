"""The rowremap signal: pending remaps that need a reset, remap failures that need an RMA."""

from __future__ import annotations

from sentinel.components.changes import Changes, forget_before, remember_change
from sentinel.components.rowremap import metrics, nvml
from sentinel.components.rowremap.parse import parse_row_remap
from sentinel.components.rowremap.record import RowRemap
from sentinel.components.rowremap.rule import evaluate_row_remap
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead, judged
from sentinel.wire import GpuSample

#: the latest reading, the one before its latest change (to see a rise), and when it changed
RemapMemory = Changes[RowRemap]


def remember(memory: RemapMemory | None, sample: GpuSample) -> tuple[RemapMemory, bool] | None:
    return remember_change(memory, sample.remap, sample.t)


def judge(gpu: GpuFacts, memory: RemapMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.cur is None:
        return []
    return judged(evaluate_row_remap(memory.cur, memory.prev), memory.t)


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.remap = nvml.read(read.get, read.gpu, read.handle)


SIGNAL = Signal[RemapMemory](
    name="rowremap",
    summary="row remapping: pending remaps that need a reset, remap failures that need an RMA",
    nvml=NvmlRead(slow=_slow),
    parse=parse_row_remap,
    memory_type=RemapMemory,
    reads=("remap",),
    remember=remember,
    on_reset=forget_before,
    judge=judge,
    precedence=40,
    render=metrics.render,
)

"""The ecc signal: uncorrectable errors, SRAM thresholds and bursts of corrected errors (and retired pages,
read and exported)."""

from __future__ import annotations

from sentinel.components.changes import Changes, forget_before, remember_change
from sentinel.components.ecc import metrics, nvml
from sentinel.components.ecc.parse import parse_ecc
from sentinel.components.ecc.record import EccCounters
from sentinel.components.ecc.rule import evaluate_ecc
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead, judged
from sentinel.wire import GpuSample

#: the latest reading, the one before its latest change (to see a rise), and when it changed
EccMemory = Changes[EccCounters]


def shows_reset(memory: EccMemory, sample: GpuSample) -> bool:
    """Volatile ECC counters restart only at a GPU reset or a driver reload: one that went down shows it."""
    before, after = memory.cur, sample.ecc
    if before is None or after is None or after is before:
        return False
    for old, new in (
        (before.volatile_corrected, after.volatile_corrected),
        (before.volatile_uncorrected, after.volatile_uncorrected),
    ):
        if old is not None and new is not None and new < old:
            return True
    return False


def remember(memory: EccMemory | None, sample: GpuSample) -> tuple[EccMemory, bool] | None:
    return remember_change(memory, sample.ecc, sample.t)


def judge(gpu: GpuFacts, memory: EccMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.cur is None:
        return []
    return judged(evaluate_ecc(memory.cur, memory.prev, settings.ecc), memory.t)


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.ecc = nvml.read_ecc(read.get, read.gpu, read.handle)
    sample.retired = nvml.read_retired(read.get, read.gpu, read.handle)


SIGNAL = Signal[EccMemory](
    name="ecc",
    summary="ECC counters and retired pages: uncorrectable errors, SRAM thresholds, worn-out boards",
    nvml=NvmlRead(slow=_slow),
    parse=parse_ecc,
    memory_type=EccMemory,
    reads=("ecc",),
    remember=remember,
    shows_reset=shows_reset,
    on_reset=forget_before,
    judge=judge,
    precedence=50,
    render=metrics.render,
)

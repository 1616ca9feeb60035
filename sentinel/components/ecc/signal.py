"""The ecc signal: uncorrectable errors, SRAM thresholds and bursts of corrected errors (and retired pages,
read and exported)."""

from __future__ import annotations

import msgspec

from sentinel.components.ecc import metrics, nvml
from sentinel.components.ecc.parse import parse_ecc
from sentinel.components.ecc.record import EccCounters
from sentinel.components.ecc.rule import evaluate_ecc
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead
from sentinel.wire import GpuSample


class EccMemory(msgspec.Struct, kw_only=True):
    """The latest counters, the reading before their latest change (to see a rise), and when they changed."""

    cur: EccCounters | None = None
    prev: EccCounters | None = None
    t: float = 0.0


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
    ecc = sample.ecc
    if ecc is None or (memory is not None and (ecc is memory.cur or ecc == memory.cur)):
        return None
    if memory is None:
        return EccMemory(cur=ecc, t=sample.t), True
    memory.prev, memory.cur, memory.t = memory.cur, ecc, sample.t
    return memory, True


def on_reset(memory: EccMemory, t: float) -> EccMemory:
    memory.prev = None  # rises are judged from the reset on
    return memory


def judge(gpu: GpuFacts, memory: EccMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.cur is None:
        return []
    finding = evaluate_ecc(memory.cur, memory.prev, settings.ecc)
    return [Judged(finding, memory.t)] if finding.state != "ok" else []


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.ecc = nvml.read_ecc(read.get, read.gpu, read.handle)
    sample.retired = nvml.read_retired(read.get, read.gpu, read.handle)


SIGNAL = Signal[EccMemory](
    name="ecc",
    summary="ECC counters and retired pages: uncorrectable errors, SRAM thresholds, worn-out boards",
    nvml=NvmlRead(slow=_slow),
    parse=parse_ecc,
    memory_type=EccMemory,
    remember=remember,
    shows_reset=shows_reset,
    on_reset=on_reset,
    judge=judge,
    precedence=50,
    render=metrics.render,
)

"""The hbm signal: HBM temperature at the memory's own maximum operating temperature (NVML's MEM_MAX
threshold) less a margin. Hot HBM throttles the memory clock (a straggler) and raises its error rate
(ECC, row remaps): a cooling problem to fix before the memory wears.

The judgement keeps a little memory: whether the GPU is hot, and since when, so a reading that hovers at
the line neither flaps the verdict nor moves its time (it clears :data:`HYSTERESIS_C` below the line).
"""

from __future__ import annotations

from typing import Final

import msgspec

from sentinel.components.hbm import nvml
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, reading
from sentinel.components.vocab import Finding
from sentinel.wire import GpuSample

#: degrees below NVML's memory maximum at which the GPU counts as hot
MARGIN_C: Final = 0.0
#: degrees below the line at which a hot GPU counts as cool again
HYSTERESIS_C: Final = 3.0


class HbmMemory(msgspec.Struct, kw_only=True):
    """The latest HBM temperature and limit, whether the GPU is hot, and since when (agent time)."""

    temp_c: float
    limit_c: float | None = None
    hot: bool = False
    since: float = 0.0


def hot(temp_c: float, limit_c: float | None, was_hot: bool) -> bool:
    """At or over ``limit - MARGIN_C``; once hot, until ``HYSTERESIS_C`` below that."""
    if limit_c is None:
        return False
    line = limit_c - MARGIN_C
    return temp_c >= (line - HYSTERESIS_C if was_hot else line)


def remember(memory: HbmMemory | None, sample: GpuSample) -> tuple[HbmMemory, bool] | None:
    temp = sample.mem_temp_c
    if temp is None:
        return None
    read_limit = reading(sample, nvml.LIMIT)
    limit = read_limit if read_limit is not None else (memory.limit_c if memory else None)
    was = memory is not None and memory.hot
    now_hot = hot(temp, limit, was)
    since = sample.t if now_hot != was or memory is None else memory.since
    return HbmMemory(temp_c=temp, limit_c=limit, hot=now_hot, since=since), now_hot != was


def judge(gpu: GpuFacts, memory: HbmMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or not memory.hot or memory.limit_c is None:
        return []
    finding = Finding(
        state="suspect",
        severity="warning",
        action="drain",
        reason="hbm_over_temperature",
        evidence=(
            f"HBM at {memory.temp_c:.0f} C, its maximum operating temperature is {memory.limit_c:.0f} C "
            "(NVML): memory clocks throttle and errors rise; check the GPU's cooling",
        ),
    )
    return [Judged(finding, memory.since)]


SIGNAL = Signal[HbmMemory](
    name="hbm",
    summary="HBM temperature against the memory's own maximum (NVML MEM_MAX threshold): a cooling problem",
    nvml=NvmlRead(slow=nvml.read),
    memory_type=HbmMemory,
    reads=("mem_temp_c", "readings"),
    remember=remember,
    judge=judge,
    precedence=70,
)

"""The retired_pages signal: pre-Ampere dynamic page retirement (``nvmlDeviceGetRetiredPages`` and its
pending status) judged. A retirement pending takes effect only at the next GPU reset / driver reload; a board
whose retired pages reach NVIDIA's limit is worn out (RMA). Ampere and later remap rows instead (the
``rowremap`` signal): there NVML answers NOT_SUPPORTED, the reading is None and nothing is judged.
"""

from __future__ import annotations

import msgspec

from sentinel.components.ecc.record import RetiredPages
from sentinel.components.ecc.rule import evaluate_retired_pages
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, Signal, judged
from sentinel.wire import GpuSample


class RetiredMemory(msgspec.Struct, kw_only=True):
    """The latest retired-page reading and the agent time it was first reported so."""

    pages: RetiredPages
    t: float = 0.0


def remember(memory: RetiredMemory | None, sample: GpuSample) -> tuple[RetiredMemory, bool] | None:
    pages = sample.retired
    if pages is None or (memory is not None and memory.pages == pages):
        return None
    return RetiredMemory(pages=pages, t=sample.t), True


def judge(gpu: GpuFacts, memory: RetiredMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None:
        return []
    return judged(evaluate_retired_pages(memory.pages, settings.ecc), memory.t)


SIGNAL = Signal[RetiredMemory](
    name="retired_pages",
    component="ecc",
    summary="pre-Ampere page retirement: a retirement pending needs a reset, retired pages at the limit an RMA",
    memory_type=RetiredMemory,
    reads=("retired",),
    remember=remember,
    judge=judge,
    precedence=52,
)

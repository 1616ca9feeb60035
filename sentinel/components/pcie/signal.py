"""The pcie signal: a mistrained link (width below its maximum) and replays climbing faster than a threshold."""

from __future__ import annotations

import msgspec

from sentinel.components.device.signal import slow_reading
from sentinel.components.pcie import metrics, nvml
from sentinel.components.pcie.record import PcieLink
from sentinel.components.pcie.rule import evaluate_link, evaluate_replay_rate
from sentinel.components.rates import Reading, counter_rate, record_change
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead, judged
from sentinel.wire import GpuSample


class PcieMemory(msgspec.Struct, kw_only=True):
    """The link as last reported (and when), the replay counter's changes and its latest reading."""

    link: PcieLink | None = None
    link_t: float = 0.0
    hist: list[Reading] = []
    prev: Reading | None = None


def remember(memory: PcieMemory | None, sample: GpuSample) -> tuple[PcieMemory, bool] | None:
    replay = sample.pcie_replay
    link_news = slow_reading(sample) and (memory is None or memory.link != sample.pcie_link)
    if replay is None and not link_news:
        return None
    mem = memory if memory is not None else PcieMemory()
    changed = False
    if replay is not None:
        prev = mem.prev
        if prev is None or prev[1] != replay:
            record_change(mem.hist, prev, sample.t, replay)
            changed = prev is not None
        mem.prev = (sample.t, replay)
    if link_news:
        mem.link, mem.link_t = sample.pcie_link, sample.t
        changed = True
    return mem, changed


def judge(gpu: GpuFacts, memory: PcieMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None:
        return []
    found: list[Judged] = []
    if memory.link is not None:
        found += judged(evaluate_link(memory.link), memory.link_t)
    if memory.prev is not None:
        rate = counter_rate(memory.hist, memory.prev, settings.rate_window_s)
        found += judged(evaluate_replay_rate(rate, settings.pcie_replays_per_s), memory.prev[0])
    return found


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.pcie_link = nvml.read_link(read.get, read.gpu, read.handle)


SIGNAL = Signal[PcieMemory](
    name="pcie",
    summary="PCIe throughput, replays, link generation / width now vs max: a flapping or mistrained link",
    nvml=NvmlRead(fast=nvml.fill, slow=_slow),
    memory_type=PcieMemory,
    reads=("pcie_replay", "recovery_action", "pcie_link", "fabric"),
    every_tick=True,
    remember=remember,
    judge=judge,
    precedence=20,
    render=metrics.render,
)

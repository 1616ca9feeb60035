"""The fabric signal: a GPU not registered with the NVLink fabric manager (NVSwitch systems)."""

from __future__ import annotations

import msgspec

from sentinel.components.device.signal import slow_reading
from sentinel.components.fabric import metrics, nvml
from sentinel.components.fabric.record import FabricInfo
from sentinel.components.fabric.rule import evaluate_fabric
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead, judged
from sentinel.wire import GpuSample


class FabricMemory(msgspec.Struct, kw_only=True):
    """The registration as last reported and the agent time it was first reported so."""

    info: FabricInfo | None = None
    t: float = 0.0


def remember(memory: FabricMemory | None, sample: GpuSample) -> tuple[FabricMemory, bool] | None:
    if not slow_reading(sample) or (memory is not None and memory.info == sample.fabric):
        return None
    return FabricMemory(info=sample.fabric, t=sample.t), True


def judge(gpu: GpuFacts, memory: FabricMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.info is None:
        return []
    return judged(evaluate_fabric(memory.info), memory.t)


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.fabric = nvml.read(read.get, read.gpu, read.handle)


SIGNAL = Signal[FabricMemory](
    name="fabric",
    summary="fabric-manager registration and clique (NVSwitch systems): an unregistered GPU hangs NCCL init",
    nvml=NvmlRead(slow=_slow),
    memory_type=FabricMemory,
    reads=("recovery_action", "pcie_link", "fabric"),
    remember=remember,
    judge=judge,
    precedence=30,
    render=metrics.render,
)

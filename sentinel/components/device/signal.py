"""The device signal: NVML device health — a lost, hung or unopenable GPU, and the driver's recovery action."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sentinel.components.device import metrics, nvml
from sentinel.components.device.rule import evaluate_recovery_action, evaluate_state
from sentinel.components.nvml_read import FieldRequest
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, NvmlRead, Signal, SlowRead
from sentinel.components.xid.signal import explains_lost
from sentinel.wire import GpuSample


class DeviceMemory(msgspec.Struct, kw_only=True):
    """The driver's latest recovery action and the agent time it was first reported."""

    recovery_action: str | None = None
    t: float = 0.0


def slow_reading(sample: GpuSample) -> bool:
    """A slow tick's sample: one that carries any of the slow device readings (recovery action, PCIe link,
    fabric registration). A fast sample says nothing about them."""
    return sample.recovery_action is not None or sample.pcie_link is not None or sample.fabric is not None


def remember(memory: DeviceMemory | None, sample: GpuSample) -> tuple[DeviceMemory, bool] | None:
    if not slow_reading(sample):
        return None
    if memory is not None and memory.recovery_action == sample.recovery_action:
        return None
    return DeviceMemory(recovery_action=sample.recovery_action, t=sample.t), True


def lost_cause_pending(gpu: GpuFacts, settings: JudgeSettings, reported_until: float) -> bool:
    """``gpu`` is lost, no Xid explains it yet, and its agent has not reported long enough past the loss
    for the Xid to have arrived: ``gpu_lost`` waits (agent time, so a skewed clock or a restart cannot
    stretch or skip the wait; a lost state restored from the store is long past it)."""
    return (
        gpu.state == "lost"
        and not explains_lost(gpu.memory.get("xid"))
        and reported_until - gpu.state_t < settings.lost_cause_wait_s
    )


def judge(gpu: GpuFacts, memory: DeviceMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    found: list[Judged] = []
    if gpu.state == "lost":
        # named by the Xid that explains it (the xid signal's finding), or after the wait for one
        if not explains_lost(gpu.memory.get("xid")) and not lost_cause_pending(
            gpu, settings, gpu.reported_until
        ):
            lost = evaluate_state("lost")
            if lost is not None:
                found.append(Judged(lost, gpu.state_t))
    else:
        state = evaluate_state(gpu.state)  # type: ignore[arg-type]
        if state is not None:
            found.append(Judged(state, gpu.state_t))
    recovery = evaluate_recovery_action(memory.recovery_action if memory is not None else None)
    if recovery is not None and recovery.state != "ok":
        found.append(Judged(recovery, memory.t if memory is not None else 0.0))
    return found


def _slow(read: SlowRead, sample: GpuSample) -> None:
    nvml.fill_fields(read.values, sample)


def _fields(links: Sequence[int]) -> list[FieldRequest]:
    return nvml.FIELDS


SIGNAL = Signal[DeviceMemory](
    name="device",
    summary="NVML device health: identity, lost / unresponsive / unavailable GPUs, GPU count vs expected",
    nvml=NvmlRead(fast=nvml.fill, slow=_slow, fields=_fields),
    memory_type=DeviceMemory,
    reads=("recovery_action", "pcie_link", "fabric"),
    remember=remember,
    judge=judge,
    precedence=10,
    render=metrics.render,
)

"""The fabric_health signal: the GB200 NVL fabric's health mask (``nvmlDeviceGetGpuFabricInfoV``).

The mask packs 2-bit fields (0: not supported, 1: true, 2: false); the ones judged here are the GPU's own
NVLink fabric state as the fabric manager sees it. Our table of nvml.h's ``NVML_GPU_FABRIC_HEALTH_MASK_*``:
"""

from __future__ import annotations

from typing import Final

import msgspec

from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, Signal
from sentinel.components.vocab import Action, Finding, GpuHealth, Severity
from sentinel.wire import GpuSample

#: a 2-bit field's value when the condition holds
TRUE: Final = 1

#: (shift, reason, health, severity, action, what it means)
CONDITIONS: Final[tuple[tuple[int, str, GpuHealth, Severity, Action, str], ...]] = (
    (0, "fabric_degraded_bandwidth", "suspect", "warning", "drain", "NVLink fabric bandwidth degraded"),
    (2, "fabric_route_recovery", "suspect", "warning", "none", "fabric route recovery in progress"),
    (4, "fabric_route_unhealthy", "faulty", "critical", "reset_gpu", "fabric route unhealthy"),
    (6, "fabric_access_timeout_recovery", "suspect", "warning", "none", "fabric access-timeout recovery"),
)


def conditions(mask: int) -> list[tuple[int, str, GpuHealth, Severity, Action, str]]:
    """The conditions ``mask`` says hold (field value TRUE); unsupported and false fields say nothing."""
    return [c for c in CONDITIONS if (mask >> c[0]) & 0b11 == TRUE]


class FabricHealthMemory(msgspec.Struct, kw_only=True):
    """The latest health mask and the agent time it was first reported."""

    mask: int
    t: float = 0.0


def remember(memory: FabricHealthMemory | None, sample: GpuSample) -> tuple[FabricHealthMemory, bool] | None:
    info = sample.fabric
    if info is None or info.health_mask is None or (memory is not None and memory.mask == info.health_mask):
        return None
    return FabricHealthMemory(mask=info.health_mask, t=sample.t), True


def judge(
    gpu: GpuFacts, memory: FabricHealthMemory | None, settings: JudgeSettings, now: float
) -> list[Judged]:
    if memory is None:
        return []
    out = []
    for _shift, reason, health, severity, action, meaning in conditions(memory.mask):
        evidence = (f"{meaning} (fabric health mask {memory.mask:#06x}, nvmlDeviceGetGpuFabricInfoV)",)
        finding = Finding(state=health, severity=severity, action=action, reason=reason, evidence=evidence)
        out.append(Judged(finding, memory.t))
    return out


SIGNAL = Signal[FabricHealthMemory](
    name="fabric_health",
    component="fabric",
    summary="GB200 NVL fabric health mask: degraded bandwidth, route recovery / unhealthy, access timeouts",
    memory_type=FabricHealthMemory,
    reads=("fabric",),
    remember=remember,
    judge=judge,
    precedence=35,
)

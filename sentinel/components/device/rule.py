"""Device rules: a GPU NVML says is lost, one whose calls hang, one NVML could not open."""

from __future__ import annotations

from sentinel.components.device.record import GpuState
from sentinel.components.vocab import Finding


def evaluate_state(state: GpuState, detail: str = "") -> Finding | None:
    if state == "lost":
        return Finding(
            state="faulty",
            severity="critical",
            action="reboot",
            reason="gpu_lost",
            evidence=("NVML: GPU is lost (fallen off the bus)",),
        )
    if state == "unresponsive":
        return Finding(
            state="faulty",
            severity="critical",
            action="reset_gpu",
            reason="gpu_unresponsive",
            evidence=("NVML calls on this GPU do not return within the agent's deadline",),
        )
    if state == "unavailable":
        return Finding(
            state="faulty",
            severity="critical",
            action="reboot",
            reason="gpu_unavailable",
            evidence=(f"NVML cannot open this GPU{': ' + detail if detail else ''}",),
        )
    return None

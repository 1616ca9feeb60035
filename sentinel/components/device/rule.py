"""Device rules: a GPU NVML says is lost, one whose calls hang, one NVML could not open or that answers none of
its calls (every call NVML_ERROR_UNKNOWN: the driver serves nothing on it; a GPU reset goes through that same
driver, so the node is rebooted to reload it)."""

from __future__ import annotations

from sentinel.components.device.record import GpuState
from sentinel.components.vocab import Action, Finding, GpuHealth


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
            evidence=(
                f"NVML cannot open this GPU, or the driver answers none of its calls{': ' + detail if detail else ''}",
            ),
        )
    return None


#: the driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) → (health, action): straight from the
#: driver, so it outranks any inference
_RECOVERY: dict[str, tuple[GpuHealth, Action]] = {
    "gpu_reset": ("faulty", "reset_gpu"),
    "node_reboot": ("faulty", "reboot"),
    "drain_p2p": ("suspect", "drain"),
    "drain_and_reset": ("faulty", "reset_gpu"),
    "bus_reset": ("faulty", "reset_gpu"),
    "system_reboot": ("faulty", "reboot"),
    "recover_imex_domain": ("suspect", "drain"),
}


def evaluate_recovery_action(recovery: str | None) -> Finding | None:
    if not recovery or recovery == "none":
        return None
    health, action = _RECOVERY.get(recovery, ("suspect", "drain"))
    return Finding(
        state=health,
        severity="critical" if health == "faulty" else "warning",
        action=action,
        reason="driver_recovery_action",
        evidence=(f"the driver asks for recovery action {recovery}",),
    )

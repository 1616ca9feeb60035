"""Fabric rule: a GPU not registered with the fabric manager hangs NCCL's init on NVSwitch systems."""

from __future__ import annotations

from typing import Final

from sentinel.components.fabric.record import FabricInfo
from sentinel.components.vocab import Finding

#: the reason of a GPU not registered with the fabric (a host's GPUs all so fold into one host verdict)
NOT_REGISTERED: Final = "fabric_not_registered"


def evaluate_fabric(info: FabricInfo) -> Finding | None:
    if info.state == "completed" and info.status == 0:
        return None
    if info.state == "completed":
        why = f"fabric registration finished with NVML error {info.status}"
    else:
        why = f"fabric registration {info.state.replace('_', ' ')}"
    return Finding(
        state="faulty",
        severity="critical",
        action="reset_gpu",
        reason=NOT_REGISTERED,
        evidence=(
            f"{why} (clique {info.clique_id}): NCCL init over NVLink hangs; check nvidia-fabricmanager",
        ),
    )

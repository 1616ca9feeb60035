"""The fabric record: a GPU's registration with the NVLink fabric manager (NVSwitch systems)."""

from __future__ import annotations

from typing import Literal

import msgspec

from sentinel.components.bounds import Short

FabricState = Literal["not_supported", "not_started", "in_progress", "completed"]


class FabricInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``nvmlDeviceGetGpuFabricInfo``: registration state, its NVML status, the clique (NVLink domain)."""

    state: FabricState
    status: int = 0  # an NVML return code: 0 = success
    clique_id: int = 0
    cluster_uuid: str = ""
    #: ``nvmlDeviceGetGpuFabricInfoV``'s health mask (R550+, GB200 NVL): 2-bit fields, see ``health.py``
    health_mask: int | None = None


class FabricManagerStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the agent ships: whether the host has the fabric manager, whether it runs, its systemd state
    (``active/running``, ``failed/failed``, ``inactive/dead``) and since when (agent time) it is so."""

    present: bool
    running: bool
    state: Short = ""
    since: float = 0.0

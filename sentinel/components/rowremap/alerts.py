"""Row-remapping alerts: a remap pending a reset, a remap that failed.

Severity and action are the rule's own outcomes (:data:`~sentinel.components.rowremap.rule.PENDING`,
:data:`~sentinel.components.rowremap.rule.FAILURE`), so the page says what the verdict says.
"""

from __future__ import annotations

from sentinel.components.alerting import AlertRule
from sentinel.components.rowremap.rule import FAILURE, PENDING

_BY = "cluster, host, gpu, uuid, pci_bus"


def alerts(settings: None = None) -> list[AlertRule]:
    """The row-remap alerts (no setting: the rule has no threshold)."""
    return [
        AlertRule(
            alert="SentinelGpuRowRemapPending",
            group="sentinel-gpu",
            comment="A pending remap only takes effect after a GPU reset; not urgent, but the GPU is running "
            "on a bad row.",
            expr=f"max by ({_BY}) (sentinel_gpu_row_remap_pending) == 1",
            for_s=300,
            severity=PENDING.severity,
            action=PENDING.action,
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} has a row remap pending; reset it when drained",
            description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}, {{ $labels.pci_bus }}) on {{ $labels.host }} "
            "has a pending row remap, applied only by a GPU reset. Drain the GPU and reset it at the next "
            "opportunity.",
        ),
        AlertRule(
            alert="SentinelGpuRowRemapFailed",
            group="sentinel-gpu",
            expr=f"max by ({_BY}) (sentinel_gpu_row_remap_failure) == 1",
            for_s=60,
            severity=FAILURE.severity,
            action=FAILURE.action,
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} row remapping failed; drain and RMA",
            description="Row remapping failed on GPU {{ $labels.gpu }} ({{ $labels.uuid }}, {{ $labels.pci_bus }}) "
            "on {{ $labels.host }}: the memory has no spare rows left for the failing address. The GPU cannot "
            "be repaired in the field; drain it and open an RMA.",
        ),
    ]

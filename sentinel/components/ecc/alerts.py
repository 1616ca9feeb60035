"""ECC alert: uncorrectable errors since the GPU's last reset.

Fires on what the rule's :data:`~sentinel.components.ecc.rule.UNCORRECTED_VOLATILE` outcome fires on (any
volatile uncorrected error), with its severity. The page's action is ``drain``, the first step before the
verdict's ``reset_gpu``: work must leave the GPU before it can be reset (Alertmanager routes on it).
"""

from __future__ import annotations

from sentinel.components.alerting import AlertRule
from sentinel.components.ecc.rule import UNCORRECTED_VOLATILE, EccThresholds


def alerts(settings: EccThresholds | None = None) -> list[AlertRule]:
    """The ECC alerts (the rule's thresholds are for RMA and bursts; this alert is on any error)."""
    return [
        AlertRule(
            alert="SentinelGpuUncorrectableEcc",
            group="sentinel-gpu",
            comment="Volatile counters reset with the GPU, so this stays active until the GPU has been reset.",
            expr="max by (cluster, host, gpu, uuid, pci_bus) "
            '(sentinel_gpu_ecc_errors{type="uncorrected", scope="volatile"}) > 0',
            for_s=60,
            severity=UNCORRECTED_VOLATILE.severity,
            action="drain",
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} has {{ $value }} uncorrectable ECC errors",
            description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.host }} reported {{ $value }} "
            "volatile uncorrectable ECC errors since its last reset. Work on it may have computed with corrupted "
            "memory. Drain the GPU, then reset it (row remap) or RMA it if remapping fails.",
        ),
    ]

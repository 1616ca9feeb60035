"""Device alerts: a GPU NVML says is lost, a GPU whose NVML calls hang.

Severity is the device rule's (:func:`~sentinel.components.device.rule.evaluate_state`). The page's action
is ``reboot`` for both: a lost GPU only comes back with one, and a GPU whose calls hang for minutes has
outlived the verdict's first remedy (a GPU reset) — Alertmanager routes on these labels.
"""

from __future__ import annotations

from sentinel.components.alerting import AlertRule, spoken
from sentinel.components.device.rule import evaluate_state

_BY = "cluster, host, gpu, uuid, pci_bus"
#: NVML may stall for seconds under load; two minutes of hung calls is not that
UNRESPONSIVE_FOR_S = 120


def alerts(settings: None = None) -> list[AlertRule]:
    """The device-state alerts."""
    lost = evaluate_state("lost")
    unresponsive = evaluate_state("unresponsive")
    assert lost is not None and unresponsive is not None  # the rule judges both states
    return [
        AlertRule(
            alert="SentinelGpuLost",
            group="sentinel-gpu",
            expr=f'max by ({_BY}) (sentinel_gpu_state{{state="lost"}}) == 1',
            for_s=30,
            severity=lost.severity,
            action=lost.action,
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} is lost (fallen off the bus)",
            description="Every NVML call on GPU {{ $labels.gpu }} ({{ $labels.uuid }}, {{ $labels.pci_bus }}) on "
            "{{ $labels.host }} fails with GPU_IS_LOST. Its job cannot progress. Drain the host and reboot it; "
            "if the GPU is lost again, RMA it.",
        ),
        AlertRule(
            alert="SentinelGpuUnresponsive",
            group="sentinel-gpu",
            comment="NVML may stall for seconds under load; two minutes of hung calls is not that.",
            expr=f'max by ({_BY}) (sentinel_gpu_state{{state="unresponsive"}}) == 1',
            for_s=UNRESPONSIVE_FOR_S,
            severity=unresponsive.severity,
            action="reboot",
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} is unresponsive (NVML calls hang)",
            description="NVML calls on GPU {{ $labels.gpu }} ({{ $labels.uuid }}, {{ $labels.pci_bus }}) on "
            f"{{{{ $labels.host }}}} have not returned for {spoken(UNRESPONSIVE_FOR_S)}. Drain the host and "
            "reboot it.",
        ),
    ]

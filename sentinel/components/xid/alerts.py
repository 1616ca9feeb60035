"""Xid alert: a GPU raised an Xid the catalog (:mod:`~sentinel.components.xid.catalog`) calls critical.

The agent labels each Xid counter with the catalog's severity, so the rule matches that label and never
lists codes: it cannot disagree with the agent or the aggregator about which Xids are critical.
"""

from __future__ import annotations

from typing import Final

from sentinel.components.alerting import AlertRule, duration, spoken
from sentinel.components.vocab import Severity

#: the catalog severity that pages
PAGED: Final[Severity] = "critical"
#: how long the alert stays after each occurrence
WINDOW_S: Final = 900


def alerts(settings: None = None) -> list[AlertRule]:
    """The Xid alerts (the catalog is their setting)."""
    by = "cluster, host, gpu, uuid, pci_bus, xid"
    series = f'sentinel_gpu_xid_events_total{{severity="{PAGED}"}}'
    window = duration(WINDOW_S)
    return [
        AlertRule(
            alert="SentinelGpuCriticalXid",
            group="sentinel-gpu",
            comment="Xids the catalog (sentinel/components/xid/catalog.py) calls critical: the agent sets the "
            "`severity`\nlabel from it, so this rule never lists codes and cannot disagree with the agent or "
            f"the aggregator.\nFires for {spoken(WINDOW_S)} after each occurrence: either the counter grew, "
            "or the series is new.",
            expr=f"max by ({by}) (\n"
            f"  increase({series}[{window}]) > 0\n"
            ") or (\n"
            f"  max by ({by}) ({series})\n"
            "  unless\n"
            f"  max by ({by}) ({series} offset {window})\n"
            ")",
            for_s=0,
            severity=PAGED,
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} raised critical Xid {{ $labels.xid }}",
            description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}, {{ $labels.pci_bus }}) on {{ $labels.host }} "
            f"raised Xid {{{{ $labels.xid }}}} in the last {spoken(WINDOW_S)}. See the runbook's table for what "
            "this Xid means and the action it calls for.",
        ),
    ]

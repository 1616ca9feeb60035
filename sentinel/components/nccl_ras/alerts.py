"""NCCL RAS alert: the agent reaches a job's RAS service but its queries keep failing."""

from __future__ import annotations

from typing import Final

from sentinel.components.alerting import AlertRule

#: failed queries in 15 minutes that are not a one-off (a query every 15 s by default: a few in a row)
FAILURES: Final = 3


def alerts(settings: None = None) -> list[AlertRule]:
    """The NCCL RAS alerts."""
    return [
        AlertRule(
            alert="SentinelNcclRasQueryFailing",
            group="sentinel-network",
            expr='sum by (cluster, host) (increase(sentinel_nccl_ras_queries_total{result="error"}[15m])) '
            f">= {FAILURES}",
            for_s=900,
            severity="warning",
            summary="NCCL RAS queries on {{ $labels.host }} keep failing",
            description="The agent on {{ $labels.host }} reaches an NCCL RAS service but its answers time out or "
            "are malformed; stalls of the job lose RAS evidence. See the agent's nccl_ras_query_failed log lines.",
        ),
        AlertRule(
            alert="SentinelNcclRasListenerUntrusted",
            group="sentinel-network",
            expr='sum by (cluster, host) (increase(sentinel_nccl_ras_queries_total{result="untrusted"}[15m])) > 0',
            for_s=0,
            severity="warning",
            summary="The NCCL RAS port on {{ $labels.host }} is held by an untrusted process",
            description="The agent on {{ $labels.host }} found the NCCL RAS port's listener owned by neither root "
            "nor a user of the job it would ask about, and did not ask it: a local process may be impersonating "
            "NCCL's RAS service. The job's RAS evidence is missing until the port is freed.",
        ),
    ]

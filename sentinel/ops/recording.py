"""The recording rules: what the fleet dashboard, the alerts and a global Prometheus read pre-aggregated.

``sentinel-recording`` saves the dashboards and alerts from re-aggregating every GPU series each time;
``sentinel-fleet`` is each cluster's summary that a global Prometheus pulls through ``/federate``
(``match[]={__name__=~"cluster.*:sentinel_.*"}``, docs/deploy.md "A fleet past one aggregator").
"""

from __future__ import annotations

from typing import Final

from sentinel.components.alerting import RecordingRule

XID_RATE: Final = RecordingRule(
    record="cluster_xid:sentinel_gpu_xid_events:rate5m",
    group="sentinel-recording",
    expr="sum by (cluster, xid) (rate(sentinel_gpu_xid_events_total[5m]))",
    comment="Fleet dashboard and alerts read these instead of re-aggregating every GPU series each time.",
)
THROTTLE_REASONS: Final = RecordingRule(
    record="cluster_reason:sentinel_gpu_throttle_reason:sum",
    group="sentinel-recording",
    expr="sum by (cluster, reason) (sentinel_gpu_throttle_reason)",
)
INGEST_LAG_P99: Final = RecordingRule(
    record="cluster:sentinel_ingest_lag_seconds:p99_5m",
    group="sentinel-recording",
    expr="histogram_quantile(0.99, sum by (cluster, le) (rate(sentinel_ingest_lag_seconds_bucket[5m])))",
)
DETECTION_LATENCY_P95: Final = RecordingRule(
    record="cluster_kind:sentinel_detection_latency_seconds:p95_15m",
    group="sentinel-recording",
    expr="histogram_quantile(0.95,\n"
    "  sum by (cluster, kind, le) (rate(sentinel_detection_latency_seconds_bucket[15m])))",
)
SPOOL_GROWTH: Final = RecordingRule(
    record="cluster_host:sentinel_agent_spool_bytes:deriv10m",
    group="sentinel-recording",
    expr="max by (cluster, host) (deriv(sentinel_agent_spool_bytes[10m]))",
)


def recording_rules() -> list[RecordingRule]:
    """Every recording rule, in file order."""
    return [
        XID_RATE,
        THROTTLE_REASONS,
        INGEST_LAG_P99,
        DETECTION_LATENCY_P95,
        SPOOL_GROWTH,
        # `max by` folds the two aggregators of an HA pair, which report the same verdicts.
        RecordingRule(
            record="cluster_kind:sentinel_verdict_open:count",
            group="sentinel-fleet",
            expr="count by (cluster, kind) (\n"
            "  max by (cluster, kind, reason, host, gpu, job, rank) (sentinel_verdict_open))",
        ),
        RecordingRule(
            record="cluster_state:sentinel_gpus:max",
            group="sentinel-fleet",
            expr="max by (cluster, state) (sentinel_gpus)",
        ),
        RecordingRule(
            record="cluster:sentinel_agents_connected:max",
            group="sentinel-fleet",
            expr="max by (cluster) (sentinel_agents_connected)",
        ),
        RecordingRule(
            record="cluster:sentinel_jobs_stalled:max",
            group="sentinel-fleet",
            expr="max by (cluster) (sentinel_jobs_stalled)",
        ),
        RecordingRule(
            record="cluster:sentinel_ingest_batches:rate5m_max",
            group="sentinel-fleet",
            expr="max by (cluster) (rate(sentinel_ingest_batches_total[5m]))",
        ),
        RecordingRule(
            record="cluster:sentinel_aggregators_up:sum",
            group="sentinel-fleet",
            expr='sum by (cluster) (up{job="sentinel-aggregator"})',
        ),
    ]

"""sentinel's own health: agents, ingest, detection latency, spool, collectors."""

from __future__ import annotations

from grafanalib.core import Dashboard

from sentinel.aggregator.alerts import INGEST_LAG_GOAL_S
from sentinel.ops.dashboards.common import CLUSTER, HOST, RATE, Size, dashboard, stat, target, timeseries

UID = "sentinel-health"


def _quantiles(metric: str, by: str, legend: str) -> list[object]:
    return [
        target(
            f"histogram_quantile({q}, sum by ({by}le) (rate({metric}_bucket{{{CLUSTER}}}[{RATE}])))",
            f"{legend}p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def build() -> Dashboard:
    return dashboard(
        UID,
        "sentinel / self health",
        "Is sentinel itself working: agents connected and scraped, ingest rate and lag, detection latency, "
        "spools, collectors.",
        [
            [
                (
                    stat(
                        "Agents connected",
                        [target(f"sum(sentinel_agents_connected{{{CLUSTER}}})", "connected")],
                    ),
                    Size(6, 6),
                ),
                (
                    stat(
                        "Scrape targets up",
                        [target('sum by (job) (up{job=~"sentinel-.*"})', "{{job}}")],
                        description="Prometheus's view: scrape jobs sentinel-agent and sentinel-aggregator.",
                    ),
                    Size(6, 6),
                ),
                (
                    stat(
                        "Incidents opened",
                        [target(f"sum(sentinel_incidents_total{{{CLUSTER}}})", "incidents")],
                    ),
                    Size(6, 6),
                ),
                (
                    stat(
                        "Oldest agent tick",
                        [
                            target(
                                f"max(time() - sentinel_agent_last_tick_timestamp_seconds{{{HOST}}})", "age"
                            )
                        ],
                        unit="s",
                    ),
                    Size(6, 6),
                ),
            ],
            [
                (
                    timeseries(
                        "Ingest rate",
                        [
                            target(
                                f"sum(rate(sentinel_ingest_batches_total{{{CLUSTER}}}[{RATE}]))", "batches/s"
                            ),
                            target(
                                f"sum(rate(sentinel_ingest_samples_total{{{CLUSTER}}}[{RATE}]))", "samples/s"
                            ),
                            target(
                                f"sum(rate(sentinel_ingest_events_total{{{CLUSTER}}}[{RATE}]))", "events/s"
                            ),
                        ],
                        unit="ops",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Ingest lag",
                        _quantiles("sentinel_ingest_lag_seconds", "", ""),
                        unit="s",
                        description="Aggregator receive time minus the batch's sampling time; "
                        f"SentinelIngestLag fires while the p99 stays above {INGEST_LAG_GOAL_S} s.",
                        threshold=INGEST_LAG_GOAL_S,
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Rejected batches by reason",
                        [
                            target(
                                f"sum by (reason) (rate(sentinel_ingest_rejected_total{{{CLUSTER}}}[{RATE}]))",
                                "{{reason}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Size(8, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "Detection latency by verdict kind",
                        _quantiles("sentinel_detection_latency_seconds", "kind, ", "{{kind}} "),
                        unit="s",
                        description="Verdict open time minus the time of its first evidence.",
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "Agents connected to the aggregator",
                        [
                            target(f"sum(sentinel_agents_connected{{{CLUSTER}}})", "aggregator's count"),
                            target(f"sum(sentinel_agent_connected{{{HOST}}})", "agents reporting connected"),
                        ],
                    ),
                    Size(12, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "Seconds since the aggregator last heard from each host",
                        [
                            target(
                                f"time() - max by (host) (sentinel_host_last_seen_timestamp_seconds{{{HOST}}})",
                                "{{host}}",
                            )
                        ],
                        unit="s",
                        description="A host whose line climbs has gone silent (see SentinelHostSilent).",
                    ),
                    Size(24, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "Spool size by host",
                        [target(f"max by (host) (sentinel_agent_spool_bytes{{{HOST}}})", "{{host}}")],
                        unit="bytes",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Batches sent vs acknowledged",
                        [
                            target(
                                f"sum(rate(sentinel_agent_batches_sent_total{{{HOST}}}[{RATE}]))", "sent/s"
                            ),
                            target(
                                f"sum(rate(sentinel_agent_batches_acked_total{{{HOST}}}[{RATE}]))", "acked/s"
                            ),
                        ],
                        unit="ops",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Dropped by agents",
                        [
                            target(
                                f"sum by (host, what) (increase(sentinel_agent_dropped_total{{{HOST}}}[{RATE}]))",
                                "{{host}} {{what}}",
                            )
                        ],
                    ),
                    Size(8, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "Collector duration",
                        [
                            target(
                                f"max by (collector) (sentinel_agent_collector_duration_seconds{{{HOST}}})",
                                "{{collector}} (max over hosts)",
                            )
                        ],
                        unit="s",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Collectors failing",
                        [
                            target(
                                f"count by (collector) (sentinel_agent_collector_success{{{HOST}}} == 0)",
                                "{{collector}}",
                            )
                        ],
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Agent queues and NVML errors",
                        [
                            target(
                                f"max by (queue) (sentinel_agent_queue_depth{{{HOST}}})", "queue {{queue}}"
                            ),
                            target(
                                "sum by (function, error) "
                                f"(rate(sentinel_agent_nvml_errors_total{{{HOST}}}[{RATE}]))",
                                "NVML {{function}} {{error}}/s",
                            ),
                        ],
                    ),
                    Size(8, 8),
                ),
            ],
        ],
    )

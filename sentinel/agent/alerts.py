"""The agent's alerts: it is not scraped, has stopped sampling, a collector keeps failing, it cannot
stream to the aggregator, its spool grows or cannot be written."""

from __future__ import annotations

from typing import Final

from sentinel.components.alerting import AlertRule, spoken
from sentinel.config.agent import AgentConfig
from sentinel.ops.recording import SPOOL_GROWTH

#: seconds since the last completed sampling tick that mean the loop has stopped (ticks are 1 s and 10 s)
STALE_AFTER_S: Final = 60


def alerts(settings: AgentConfig) -> list[AlertRule]:
    """The agent's alerts (``settings``: the agent configuration they assume)."""
    down_for, collector_for, disconnected_for, spool_for = 300, 120, 300, 600
    return [
        AlertRule(
            alert="SentinelAgentDown",
            group="sentinel-self",
            expr='up{job="sentinel-agent"} == 0',
            for_s=down_for,
            severity="warning",
            summary="Prometheus cannot scrape the sentinel agent at {{ $labels.instance }}",
            description="Scrapes of the sentinel agent at {{ $labels.instance }} have failed for "
            f"{spoken(down_for)}: the agent is stopped, crashed, or its metrics port is unreachable. GPU faults "
            "on that host go unnoticed.",
        ),
        AlertRule(
            alert="SentinelAgentStale",
            group="sentinel-self",
            comment="The metrics endpoint answers but the sampling loop has stopped (a hung collector, a stuck "
            "event loop).",
            expr=f"time() - max by (cluster, host) (sentinel_agent_last_tick_timestamp_seconds) > {STALE_AFTER_S}",
            for_s=120,
            severity="warning",
            summary="Sentinel agent on {{ $labels.host }} has stopped sampling",
            description="The agent on {{ $labels.host }} last completed a sampling tick "
            "{{ $value | humanizeDuration }} ago, although its metrics endpoint still answers.",
        ),
        AlertRule(
            alert="SentinelAgentCollectorFailing",
            group="sentinel-self",
            comment="A collector failing for two minutes of ticks: for nvml, the host's GPUs are not monitored "
            "at all\n(NVML not loaded, init failing, re-initialising) - the agent still ticks and streams, so "
            "nothing\nelse would notice.",
            expr="max by (cluster, host, collector) (sentinel_agent_collector_success) == 0",
            for_s=collector_for,
            severity="critical",
            summary="Sentinel agent on {{ $labels.host }}: collector {{ $labels.collector }} keeps failing",
            description="The {{ $labels.collector }} collector of the agent on {{ $labels.host }} has failed on "
            f"every tick for {spoken(collector_for)}; what it reads is not monitored. See the agent's log "
            "(collector_failed, gpu_source_open_failed) and its /healthz.",
        ),
        AlertRule(
            alert="SentinelAgentDisconnected",
            group="sentinel-self",
            expr="max by (cluster, host) (sentinel_agent_connected) == 0",
            for_s=disconnected_for,
            severity="warning",
            summary="Sentinel agent on {{ $labels.host }} is not connected to the aggregator",
            description="The agent on {{ $labels.host }} has had no WebSocket stream to the aggregator for "
            f"{spoken(disconnected_for)}; it is spooling to disk and the aggregator cannot correlate this "
            "host's GPUs.",
        ),
        AlertRule(
            alert="SentinelAgentStreamRefused",
            group="sentinel-self",
            expr="sum by (cluster, host, reason) (increase(sentinel_agent_stream_refused_total[10m])) > 0",
            for_s=60,
            severity="warning",
            summary="The aggregator refuses the agent on {{ $labels.host }} ({{ $labels.reason }})",
            description="The agent on {{ $labels.host }} cannot stream: {{ $labels.reason }} (token_file: its "
            "token file is missing or empty; unauthorized: the aggregator does not know the token; "
            "host_not_allowed: the token is bound to other host names). Its journal names the token file.",
        ),
        AlertRule(
            alert="SentinelSpoolGrowing",
            group="sentinel-self",
            expr=f"{SPOOL_GROWTH.record} > 0\n"
            "and on (cluster, host)\n"
            "max by (cluster, host) (sentinel_agent_spool_bytes) > 0",
            for_s=spool_for,
            severity="warning",
            summary="Sentinel agent spool on {{ $labels.host }} keeps growing",
            description="The on-disk spool of the agent on {{ $labels.host }} has grown for "
            f"{spoken(spool_for)} (by {{{{ $value | humanize1024 }}}}B/s): its batches are not acknowledged by "
            "the aggregator. When the spool reaches its bound the agent drops samples.",
        ),
        AlertRule(
            alert="SentinelAgentSpoolFailing",
            group="sentinel-self",
            expr="sum by (cluster, host) (increase(sentinel_agent_spool_write_errors_total[15m])) > 0",
            for_s=60,
            severity="warning",
            summary="The agent on {{ $labels.host }} cannot write its spool",
            description="The agent on {{ $labels.host }} failed to write spooled batches or aggregator acks to "
            "its state directory in the last 15 minutes: batches not on disk are lost if the agent restarts "
            "before they are acknowledged, and a lost ack makes an aggregator be sent a batch again.",
        ),
    ]

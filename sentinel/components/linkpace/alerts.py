"""Link-pace alerts: a link that slows its job, and interfaces the agent cannot read."""

from __future__ import annotations

from sentinel.components.alerting import AlertRule

VERDICT_BY = "cluster, host, gpu, job, rank, reason, action"


def alerts() -> list[AlertRule]:
    return [
        AlertRule(
            alert="SentinelLinkSlow",
            group="sentinel-network",
            comment="the link_pace detector's verdict: the job is slower than its own baseline in communication "
            "and this link\nstands out among the job's links (persistence evaluations in a row already passed)",
            expr=f'max by ({VERDICT_BY}) (sentinel_verdict_open{{kind="degraded",reason="link_slow"}}) == 1',
            for_s=60,
            severity="warning",
            takes_reasons="link_slow",
            summary="A link on {{ $labels.host }} slows job {{ $labels.job }}",
            description="A port or interface on {{ $labels.host }} (serving GPU "
            '{{ or $labels.gpu "several" }}, rank {{ or $labels.rank "several" }}) stands out among job '
            "{{ $labels.job }}'s links while the job runs slower than its own baseline in communication; the "
            "verdict's evidence names the link, the cost and the counters. Recommended action: "
            "{{ $labels.action }}.",
        ),
        AlertRule(
            alert="SentinelNetdevReadErrors",
            group="sentinel-network",
            comment="the collector never dies from what it reads; this is the metric that says it could not read",
            expr="sum by (cluster, host) (increase(sentinel_netdev_read_errors_total[15m])) > 0",
            for_s=900,
            severity="warning",
            summary="The agent on {{ $labels.host }} cannot read some network interfaces",
            description="sentinel-agent on {{ $labels.host }} keeps failing to read files under class/net or "
            "to dump the qdiscs (see its netdev_read_problem log lines); what it cannot read is not judged.",
        ),
    ]

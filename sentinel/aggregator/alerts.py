"""The aggregator's alerts: its verdicts (faulty, degraded, stalled, straggler, silent host) and its own
health (detectors, reloads, ingest, host clocks, durable state).

Thresholds that are settings come from the aggregator's configuration: the clock-rate error at which a
host's ranks stop being judged (``detect.straggler.max_clock_rate_error``) is the rate at which its clock
skew pages. A verdict whose reason another alert takes (``AlertRule.takes_reasons``: ports, links, switches,
the fabric manager) is left out of the GPU alerts; NVLink domain verdicts (reason ``fabric_domain_*``, no
host: the domain's hosts are in the verdict) have their alerts here.
"""

from __future__ import annotations

from typing import Final

from sentinel.components.alerting import AlertRule, reasons_taken, spoken
from sentinel.components.fabric.domain import DOMAIN_DOWN, DOMAIN_INCOMPLETE
from sentinel.config.aggregator import AggregatorConfig
from sentinel.ops.recording import INGEST_LAG_P99

#: seconds of changes the state store could not commit before its alert fires (a hung disk raises no error)
COMMIT_LAG_S: Final = 30

GPU_BY: Final = "cluster, host, gpu, job, rank, reason, action"
JOB_BY: Final = "cluster, job, host, gpu, rank, reason, action"
#: seconds a host's clock may be off before it pages (a rate error is the straggler detector's setting)
CLOCK_OFFSET_S: Final = 30
#: the goal for the ingest lag's p99, in seconds
INGEST_LAG_GOAL_S: Final = 10


def clock_skew_expr(settings: AggregatorConfig) -> str:
    """A host whose clock rate is off by more than the straggler detector tolerates, or far off."""
    rate = settings.detect.straggler.max_clock_rate_error
    return (
        f"max by (cluster, host) (abs(sentinel_host_clock_rate - 1)) > {rate:g}\n"
        f"or max by (cluster, host) (abs(sentinel_host_clock_offset_seconds)) > {CLOCK_OFFSET_S}"
    )


def alerts(settings: AggregatorConfig, elsewhere: list[AlertRule] | None = None) -> list[AlertRule]:
    """The aggregator's alerts for its configuration ``settings``; the GPU alerts leave out the reasons that
    the alerts ``elsewhere`` (every other owner's) or the domain alerts here take."""
    domains = _domains()
    return [*_gpus(reasons_taken([*domains, *(elsewhere or [])])), *domains, *_jobs(), *_health(settings)]


def _gpus(not_gpu: str) -> list[AlertRule]:
    degraded_for = 600
    return [
        AlertRule(
            alert="SentinelGpuFaulty",
            group="sentinel-gpu",
            comment="The aggregator's verdict already debounces the evidence; `for` only rides out a restart "
            "blip.\nnetwork verdicts (reason ib_*, link_slow) have their own alerts in sentinel-network, naming the port",
            expr=f'max by ({GPU_BY}) (sentinel_verdict_open{{kind="faulty",reason!~"{not_gpu}"}}) == 1',
            for_s=30,
            severity="critical",
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} is faulty ({{ $labels.reason }}); "
            "action: {{ $labels.action }}",
            description="Sentinel opened a faulty verdict for GPU {{ $labels.gpu }} on {{ $labels.host }} (reason "
            '{{ $labels.reason }}, job {{ or $labels.job "none" }}, rank {{ or $labels.rank "none" }}). '
            "Recommended action: {{ $labels.action }}.",
        ),
        AlertRule(
            alert="SentinelGpuDegraded",
            group="sentinel-gpu",
            expr=f'max by ({GPU_BY}) (sentinel_verdict_open{{kind="degraded",reason!~"{not_gpu}"}}) == 1',
            for_s=degraded_for,
            severity="warning",
            summary="GPU {{ $labels.host }}/{{ $labels.gpu }} is degraded ({{ $labels.reason }})",
            description="Sentinel has judged GPU {{ $labels.gpu }} on {{ $labels.host }} degraded for "
            f"{spoken(degraded_for)} (reason {{{{ $labels.reason }}}}, job "
            '{{ or $labels.job "none" }}). Recommended action: {{ $labels.action }}.',
        ),
    ]


def _jobs() -> list[AlertRule]:
    straggler_for = 300
    return [
        AlertRule(
            alert="SentinelJobStalled",
            group="sentinel-jobs",
            comment="One alert per culprit (an open stuck or faulty verdict in the stalled job); a stalled job "
            "without a\nnamed culprit still alerts, with job only.",
            expr="(\n"
            f'  max by ({JOB_BY}) (sentinel_verdict_open{{kind=~"stuck|faulty"}})\n'
            "  and on (cluster, job)\n"
            "  (max by (cluster, job) (sentinel_job_stalled) == 1)\n"
            ")\n"
            "or on (cluster, job)\n"
            "(max by (cluster, job) (sentinel_job_stalled) == 1)",
            for_s=60,
            severity="critical",
            summary="Job {{ $labels.job }} is stalled{{ if $labels.rank }}: culprit rank {{ $labels.rank }} on "
            "{{ $labels.host }}/GPU {{ $labels.gpu }} ({{ $labels.reason }}){{ else }}: no culprit named "
            "yet{{ end }}",
            description="Training job {{ $labels.job }} has made no collective progress for over a minute. "
            "{{ if $labels.rank }}Sentinel names rank {{ $labels.rank }} on host {{ $labels.host }}, GPU "
            "{{ $labels.gpu }} as the culprit (reason {{ $labels.reason }}); recommended action: "
            "{{ $labels.action }}.{{ else }}Sentinel has not named a culprit; check the job's incident.{{ end }}",
        ),
        AlertRule(
            alert="SentinelStraggler",
            group="sentinel-jobs",
            expr=f'max by ({JOB_BY}) (sentinel_verdict_open{{kind="straggler"}}) == 1',
            for_s=straggler_for,
            severity="warning",
            summary="Rank {{ $labels.rank }} of job {{ $labels.job }} on {{ $labels.host }}/GPU {{ $labels.gpu }} "
            "is a straggler",
            description="Rank {{ $labels.rank }} of job {{ $labels.job }} (host {{ $labels.host }}, GPU "
            f"{{{{ $labels.gpu }}}}) has been slower than its peers for {spoken(straggler_for)} (reason "
            "{{ $labels.reason }}); the whole job runs at its pace. Recommended action: {{ $labels.action }}.",
        ),
        AlertRule(
            alert="SentinelHostSilent",
            group="sentinel-jobs",
            expr='max by (cluster, host, reason, action) (sentinel_verdict_open{kind="host_silent"}) == 1',
            for_s=60,
            severity="critical",
            summary="Host {{ $labels.host }} has gone silent",
            description="The aggregator has received nothing from host {{ $labels.host }} (reason "
            "{{ $labels.reason }}): the host, its network or its agent is down. Recommended action: "
            "{{ $labels.action }}.",
        ),
    ]


def _domains() -> list[AlertRule]:
    return [
        AlertRule(
            alert="SentinelNvlinkDomainDown",
            group="sentinel-gpu",
            comment="One verdict per NVLink domain whose GPUs of several hosts lost their fabric together; "
            "its hosts are\nin the verdict (GET /api/v1/verdicts), not in the labels.",
            expr="max by (cluster, reason, action) "
            f'(sentinel_verdict_open{{kind="faulty",reason="{DOMAIN_DOWN.reason}"}}) == 1',
            for_s=30,
            severity=DOMAIN_DOWN.severity,
            takes_reasons=DOMAIN_DOWN.reason,
            summary="An NVLink domain lost its fabric; action: {{ $labels.action }} every host of it",
            description="GPUs on several hosts of one NVLink domain (fabric cluster UUID and clique) lost their "
            "fabric together (registration, route or bandwidth). The verdict names the domain and its hosts. "
            "Recommended action: {{ $labels.action }} every host of the domain and check the NVSwitch trays and "
            "the fabric manager.",
        ),
        AlertRule(
            alert="SentinelNvlinkDomainIncomplete",
            group="sentinel-gpu",
            expr=f'max by (cluster, reason) (sentinel_verdict_open{{reason="{DOMAIN_INCOMPLETE.reason}"}}) == 1',
            for_s=600,
            severity=DOMAIN_INCOMPLETE.severity,
            takes_reasons=DOMAIN_INCOMPLETE.reason,
            summary="An NVLink domain has fewer GPUs or hosts reporting than expected",
            description="An NVLink domain has had fewer GPUs or hosts reporting than detect.fabric_domain "
            f"expects for {spoken(600)}; jobs sized for the whole domain cannot run there.",
        ),
    ]


def _health(settings: AggregatorConfig) -> list[AlertRule]:
    detector_for, down_for = 600, 120
    rate = settings.detect.straggler.max_clock_rate_error
    return [
        AlertRule(
            alert="SentinelDetectorFailing",
            group="sentinel-self",
            comment="One detector raising is counted and the others still run; while it keeps raising, its rule\n"
            "family (say every straggler verdict) is blind. Switch it off (detect.disabled + SIGHUP) or fix it.",
            expr="max by (cluster, detector) (rate(sentinel_aggregator_detector_failures_total[5m])) > 0",
            for_s=detector_for,
            severity="critical",
            summary="Sentinel detector {{ $labels.detector }} keeps failing",
            description="The aggregator's {{ $labels.detector }} detector has raised on every 5-minute window for "
            f"{spoken(detector_for)}; its verdicts are not being made. The other detectors still run.",
        ),
        AlertRule(
            alert="SentinelConfigReloadFailed",
            group="sentinel-self",
            expr="max by (cluster) (sentinel_aggregator_config_last_reload_success) == 0",
            for_s=60,
            severity="warning",
            summary="Sentinel aggregator refused its new configuration",
            description="The latest SIGHUP reload of the aggregator's configuration was refused (a bad file); the "
            "aggregator keeps running with the previous configuration until the file is fixed and reloaded.",
        ),
        AlertRule(
            alert="SentinelAgentDataDropped",
            group="sentinel-self",
            expr="sum by (cluster, host, what) (increase(sentinel_agent_reported_drops_total[15m])) > 0",
            for_s=60,
            severity="warning",
            summary="The agent on {{ $labels.host }} dropped {{ $value | humanize }} {{ $labels.what }}",
            description="The agent on {{ $labels.host }} reported to the aggregator that it had to drop "
            "{{ $labels.what }} in the last 15 minutes (spool full during an outage, oversize events, or "
            "flight-recorder datagrams refused): verdicts about that host may lack evidence.",
        ),
        AlertRule(
            alert="SentinelAggregatorDown",
            group="sentinel-self",
            expr='up{job="sentinel-aggregator"} == 0 or absent(up{job="sentinel-aggregator"})',
            for_s=down_for,
            severity="critical",
            summary="The sentinel aggregator is down or not scraped",
            description="Prometheus has not scraped the sentinel aggregator "
            '({{ or $labels.instance "no target configured" }}) '
            f"for {spoken(down_for)}. No verdicts are made and no fault alerts can fire while it is down.",
        ),
        AlertRule(
            alert="SentinelIngestLag",
            group="sentinel-self",
            expr=f"{INGEST_LAG_P99.record} > {INGEST_LAG_GOAL_S}",
            for_s=300,
            severity="warning",
            summary="Sentinel ingest lag p99 is {{ $value | humanizeDuration }}",
            description="99% of batches reach the aggregator within {{ $value | humanizeDuration }} of being "
            f"sampled (over 5 minutes; the goal is under {INGEST_LAG_GOAL_S}s). Detection is delayed by as much.",
        ),
        AlertRule(
            alert="SentinelIngestRefusing",
            group="sentinel-self",
            comment="host_evicted is retention making room, not a refusal",
            expr='sum by (cluster, reason) (increase(sentinel_ingest_rejected_total{reason!="host_evicted"}[10m])) '
            "> 20",
            for_s=120,
            severity="warning",
            summary="The aggregator refused {{ $value | humanize }} connections or frames ({{ $labels.reason }})",
            description="In the last 10 minutes the aggregator of {{ $labels.cluster }} refused "
            "{{ $value | humanize }} connections or frames for {{ $labels.reason }}: a misconfigured agent "
            "retrying, or a flood from one address. The log has the first refusal of each reason per 10 s (peer "
            "address, host) and a connections_refused summary line.",
        ),
        AlertRule(
            alert="SentinelHostClockSkew",
            group="sentinel-self",
            comment="the rate is the straggler detector's max_clock_rate_error: past it, the host's ranks are "
            "not judged",
            expr=clock_skew_expr(settings),
            for_s=300,
            severity="warning",
            summary="The clock of {{ $labels.host }} is off",
            description="The batches of {{ $labels.host }} are stamped by a clock that runs faster or slower than "
            f"the aggregator's by more than {rate * 100:g}%, or is more than {CLOCK_OFFSET_S} s off. Its ranks' "
            "step times are not judged (no straggler verdict can name it for its clock); samples stamped far "
            "ahead are ignored. Fix the host's time synchronisation (chrony/NTP).",
        ),
        AlertRule(
            alert="SentinelStateStoreFailing",
            group="sentinel-self",
            expr="increase(sentinel_aggregator_state_errors_total[10m]) > 0 "
            f"or max by (cluster, instance, job) (sentinel_aggregator_state_commit_lag_seconds) > {COMMIT_LAG_S}",
            for_s=60,
            severity="warning",
            summary="Sentinel aggregator {{ $labels.instance }} cannot keep its durable state",
            description="The aggregator failed to write, snapshot or restore its state database (state.sqlite3) in "
            f"the last 10 minutes, or has changes it could not commit for more than {COMMIT_LAG_S} s (full disk, "
            "read-only or hung file system). Failed commits are kept and retried; until one succeeds the batches "
            "they cover are not acked, so the agents keep them spooled and resend them. It still detects from "
            "memory.",
        ),
        AlertRule(
            alert="SentinelStateSnapshotTooLarge",
            group="sentinel-self",
            expr="increase(sentinel_aggregator_state_snapshots_too_large_total[30m]) > 0",
            for_s=60,
            severity="warning",
            summary="Sentinel aggregator {{ $labels.instance }} does not persist {{ $labels.member }}'s memory",
            description="The memory of {{ $labels.member }} (state holder {{ $labels.holder }}) grew past the state "
            "store's per-member cap and was not written in the last 30 minutes. Verdicts are still persisted, "
            "but a restart loses that detector's warm start (step histories, streaks).",
        ),
    ]

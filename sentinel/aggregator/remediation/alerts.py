"""Remediation's alerts: the drain circuit breaker is open, actions fail, a node was drained, the requeue
breaker refused, an incident waits too long for its drain or for its job to move again."""

from __future__ import annotations

from sentinel.components.alerting import AlertRule
from sentinel.config.aggregator import RemediationConfig


def alerts(settings: RemediationConfig) -> list[AlertRule]:
    """The remediation alerts (they fire on what remediation does, whichever rules it is given)."""
    return [
        AlertRule(
            alert="SentinelRemediationBreakerOpen",
            group="sentinel-remediation",
            comment="The breaker counts from Slurm's own node states; while it is open nothing else gets drained.",
            expr="max by (cluster) (sentinel_remediation_breaker_open) == 1",
            for_s=0,
            severity="critical",
            summary="Sentinel's drain circuit breaker is open in cluster {{ $labels.cluster }}",
            description="Sentinel refused to drain a node because too many nodes are already drained by sentinel "
            "within its window, or too much of the partition is down or drained. Either the fleet has a real "
            "widespread problem or a rule is misfiring; faulty nodes now stay in service until someone decides.",
        ),
        AlertRule(
            alert="SentinelRemediationFailing",
            group="sentinel-remediation",
            expr='sum by (cluster) (increase(sentinel_remediation_actions_total{outcome="failed"}[15m])) > 0\n'
            "or sum by (cluster) (increase(sentinel_remediation_audit_errors_total[15m])) > 0\n"
            "or sum by (cluster) (increase(sentinel_remediation_lease_errors_total[15m])) > 0",
            for_s=300,
            severity="warning",
            summary="Sentinel remediation actions are failing in cluster {{ $labels.cluster }}",
            description="Drains or resumes failed in the last 15 minutes (scontrol/sinfo errors or timeouts, "
            "unknown node names), the audit log could not be written, or the remediation lease file could not "
            "be renewed (an HA pair's shared lease). Verdicts that ask for a drain are not acted on.",
        ),
        AlertRule(
            alert="SentinelRemediationLeaseInvalid",
            group="sentinel-remediation",
            expr="max by (cluster) (sentinel_remediation_lease_invalid) == 1",
            for_s=60,
            severity="warning",
            summary="The remediation lease of cluster {{ $labels.cluster }} holds an invalid record",
            description="The shared remediation lease file names a holder whose lease runs out further ahead than "
            "one term plus the skew allowance: a holder whose clock runs far ahead, or a hand-edited file. The "
            "record is not believed: if it stays unchanged it is taken over after a term, if its holder keeps "
            "renewing it that holder acts while its clock is wrong.",
        ),
        AlertRule(
            alert="SentinelRemediationNodeHeldDown",
            group="sentinel-remediation",
            expr="max by (cluster) (sentinel_remediation_held_down_nodes) > 0",
            for_s=0,
            severity="warning",
            summary="{{ $value | humanize }} node(s) held down by sentinel in cluster {{ $labels.cluster }}",
            description="A node was drained again and again for the same GPU and reason (the fault returns after "
            "each reset or resume), so sentinel no longer resumes it on its own. It stays drained until someone "
            "repairs the GPU and resumes the node.",
        ),
        AlertRule(
            alert="SentinelNodeDrained",
            group="sentinel-remediation",
            expr='sum by (cluster) (increase(sentinel_remediation_actions_total{action="drain",outcome="done"}[1h])) '
            "> 0",
            for_s=0,
            severity="info",
            summary="Sentinel drained {{ $value | humanize }} Slurm node(s) in cluster {{ $labels.cluster }} in the "
            "last hour",
            description='Sentinel drained Slurm nodes on its own (reason starting "sentinel:"). Running jobs '
            "finish; no new job lands there until the node is repaired and resumed.",
        ),
        AlertRule(
            alert="SentinelRequeueBreakerOpen",
            group="sentinel-remediation",
            expr='sum by (cluster) (increase(sentinel_remediation_actions_total{action="requeue",reason="breaker_requeues"}'
            "[1h])) > 0",
            for_s=0,
            severity="warning",
            summary="Sentinel refused to requeue a job in cluster {{ $labels.cluster }}: too many requeues",
            description="Sentinel drained a node under a running job but did not requeue the job, because it "
            "already requeued remediation.requeue.max_requeues jobs within its window. The job stays where it "
            "is (hung or on a failing GPU) until someone requeues or cancels it.",
        ),
        AlertRule(
            alert="SentinelIncidentDrainSlow",
            group="sentinel-remediation",
            comment="Only incidents whose drain was attempted wait for it (the policy may leave a verdict alone).",
            expr='max by (cluster) (sentinel_incident_waiting_seconds{step="drain"}) > 300',
            for_s=0,
            severity="warning",
            summary="An incident in cluster {{ $labels.cluster }} has waited {{ $value | humanizeDuration }} for "
            "its drain",
            description="A verdict named a faulty GPU or a stuck rank, remediation tried to drain its node and "
            "has not managed to for more than 5 minutes (refused by a breaker, Slurm failing, a lease not held). "
            "The node may still take new jobs.",
        ),
        AlertRule(
            alert="SentinelIncidentNotResumed",
            group="sentinel-remediation",
            expr='max by (cluster) (sentinel_incident_waiting_seconds{step="resume"}) > 1800',
            for_s=0,
            severity="warning",
            summary="A job in cluster {{ $labels.cluster }} has not moved again {{ $value | humanizeDuration }} "
            "after its incident's drain or requeue",
            description="An incident's node was drained (and its job requeued) more than 30 minutes ago and "
            "the job's step clock has not moved since: the requeued job is pending (no free nodes, held, a "
            "begin time), failing at start, or was not requeued. Its GPUs are idle; the goodput ledger counts "
            "the time lost.",
        ),
    ]

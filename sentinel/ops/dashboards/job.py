"""Job view: the ranks of one training job, which one stalls it, and which ones are slow."""

from __future__ import annotations

from grafanalib.core import Dashboard

from sentinel.ops.dashboards.common import (
    CLUSTER,
    JOB,
    RATE,
    Size,
    dashboard,
    stat,
    state_grid,
    table,
    target,
    timeseries,
)

UID = "sentinel-job"


def rank_state_expr() -> str:
    """Per rank, the worst state (see STATE_VALUES): `or` keeps the left-most, so worst comes first."""
    by = "max by (job, rank, host, gpu)"
    return (
        f"({by} (sentinel_gpu_up{{{JOB}}} == 0) + 5)"
        f' or ({by} (sentinel_verdict_open{{{JOB},kind="faulty"}}) * 4)'
        f' or ({by} (sentinel_verdict_open{{{JOB},kind="stuck"}}) * 3)'
        f' or ({by} (sentinel_verdict_open{{{JOB},kind="degraded"}}) * 2)'
        f' or ({by} (sentinel_verdict_open{{{JOB},kind="straggler"}}))'
        f" or ({by} (sentinel_gpu_up{{{JOB}}}) * 0)"
    )


def build() -> Dashboard:
    return dashboard(
        UID,
        "sentinel / job",
        "One training job: ranks by state, the stalled collective's culprit, stragglers.",
        [
            [
                (
                    stat(
                        "Stalled",
                        [target(f"max by (job) (sentinel_job_stalled{{{JOB}}})", "{{job}}")],
                        description="1 while the job makes no collective progress.",
                    ),
                    Size(6, 6),
                ),
                (
                    stat("Ranks", [target(f"sum by (job) (sentinel_job_ranks{{{JOB}}})", "{{job}}")]),
                    Size(6, 6),
                ),
                (
                    stat(
                        "Ranks with an open verdict",
                        [
                            target(f"count(sentinel_verdict_open{{{JOB}}}) or vector(0)", "total"),
                            target(f"count by (kind) (sentinel_verdict_open{{{JOB}}})", "{{kind}}"),
                        ],
                    ),
                    Size(12, 6),
                ),
            ],
            [
                (
                    state_grid(
                        "Ranks by state",
                        [target(rank_state_expr(), "rank {{rank}} ({{host}}/{{gpu}})")],
                        description="Worst state per rank: lost > faulty > stuck > degraded > straggler > "
                        "healthy.",
                    ),
                    Size(24, 12),
                ),
            ],
            [
                (
                    table(
                        "Stalled collective: culprit",
                        "max by (job, rank, host, gpu, reason, action) "
                        f'(sentinel_verdict_open{{{JOB},kind=~"stuck|faulty"}})'
                        f" and on (job) (max by (job) (sentinel_job_stalled{{{JOB}}}) == 1)",
                        description="The rank sentinel names as the cause of the stall; the collective "
                        "(group, sequence number, op) and evidence are in the job's incident "
                        "(/api/v1/jobs/<job>, /api/v1/incidents).",
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "NCCL / PyTorch trouble on the job's hosts",
                        [
                            target(
                                "sum by (host, kind) (increase(sentinel_log_events_total"
                                f'{{{CLUSTER},kind=~"nccl_warn.*|torch_.*"}}[{RATE}]))'
                                f" and on (host) count by (host) (sentinel_gpu_info{{{JOB}}})",
                                "{{host}} {{kind}}",
                            )
                        ],
                    ),
                    Size(12, 8),
                ),
            ],
            [
                (
                    table(
                        "Stragglers",
                        "max by (job, rank, host, gpu, reason, action) "
                        f'(sentinel_verdict_open{{{JOB},kind="straggler"}})',
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "SM clock by rank",
                        [target(f"max by (rank) (sentinel_gpu_sm_clock_hertz{{{JOB}}})", "rank {{rank}}")],
                        unit="hertz",
                        description="A rank whose clock drops below the others' (throttling) straggles.",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "GPU utilisation by rank",
                        [
                            target(
                                f"max by (rank) (sentinel_gpu_utilization_ratio{{{JOB}}})",
                                "rank {{rank}}",
                            )
                        ],
                        unit="percentunit",
                    ),
                    Size(8, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "Throttle reasons active on the job's GPUs",
                        [
                            target(
                                f'sum by (reason) (sentinel_gpu_throttle_reason{{{JOB},reason!="gpu_idle"}})',
                                "{{reason}}",
                            )
                        ],
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "Xids on the job's GPUs",
                        [
                            target(
                                f"sum by (rank, xid) (increase(sentinel_gpu_xid_events_total{{{JOB}}}[{RATE}]))",
                                "rank {{rank}} Xid {{xid}}",
                            )
                        ],
                    ),
                    Size(12, 8),
                ),
            ],
        ],
    )

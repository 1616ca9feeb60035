"""Fleet overview: how healthy the cluster's GPUs are, what sentinel has found, and where to look next."""

from __future__ import annotations

from grafanalib.core import Dashboard, TimeSeries

from sentinel.components.ib.alerts import LINK_DOWNS
from sentinel.ops.dashboards.common import (
    CLUSTER,
    RATE,
    Size,
    bargauge,
    dashboard,
    stat,
    table,
    target,
    timeseries,
)
from sentinel.ops.settings import OpsSettings

UID = "sentinel-fleet"


def flaps_panel(settings: OpsSettings) -> TimeSeries:
    """Losses of link per port, with the flap threshold the verdict and SentinelIbLinkFlapping use."""
    flap_downs = settings.aggregator.detect.network.flap_downs
    return timeseries(
        "Losses of link (flaps) in the agents' window",
        [
            target(
                f"max by (host, device, port) ({LINK_DOWNS}{{{CLUSTER}}}) > 0",
                "{{host}} {{device}}/{{port}}",
            )
        ],
        description=f"{flap_downs} or more is a flap (SentinelIbLinkFlapping).",
        threshold=flap_downs,
    )


def build(settings: OpsSettings | None = None) -> Dashboard:
    settings = settings or OpsSettings()
    return dashboard(
        UID,
        "sentinel / fleet overview",
        "GPUs by health state, open verdicts, throttling and Xid rates across the cluster.",
        [
            [
                (
                    bargauge(
                        "GPUs by health state",
                        [target(f"sum by (state) (sentinel_gpus{{{CLUSTER}}})", "{{state}}")],
                        description="The aggregator's classification of every GPU it knows.",
                    ),
                    Size(8, 8),
                ),
                (
                    stat(
                        "Open verdicts",
                        [
                            # a 0 rather than "No data" when nothing is open
                            target(f"count(sentinel_verdict_open{{{CLUSTER}}}) or vector(0)", "total"),
                            target(
                                f"count by (kind) (sentinel_verdict_open{{{CLUSTER}}})",
                                "{{kind}}",
                            ),
                        ],
                        description="Faulty, degraded, stuck, straggler and silent-host verdicts still open.",
                    ),
                    Size(8, 8),
                ),
                (
                    stat(
                        "Stalled jobs / agents connected",
                        [
                            target(f"sum(sentinel_jobs_stalled{{{CLUSTER}}})", "stalled jobs"),
                            target(f"sum(sentinel_agents_connected{{{CLUSTER}}})", "agents connected"),
                        ],
                    ),
                    Size(8, 8),
                ),
            ],
            [
                (
                    table(
                        "Open verdicts (culprit and recommended action)",
                        "max by (kind, reason, action, host, gpu, job, rank) "
                        f"(sentinel_verdict_open{{{CLUSTER}}})",
                        description="One row per open verdict; details and evidence: /api/v1/verdicts.",
                    ),
                    Size(24, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "GPUs by health state over time",
                        [target(f"sum by (state) (sentinel_gpus{{{CLUSTER}}})", "{{state}}")],
                        stack=True,
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "Xid rate by code",
                        [
                            target(
                                f"sum by (xid) (cluster_xid:sentinel_gpu_xid_events:rate5m{{{CLUSTER}}})",
                                "Xid {{xid}}",
                            )
                        ],
                        unit="ops",
                        description="From the recording rule over 5 minutes (rules/sentinel.rules.yml).",
                    ),
                    Size(12, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "GPUs throttled, by reason",
                        [
                            target(
                                "sum by (reason) (cluster_reason:sentinel_gpu_throttle_reason:sum"
                                f'{{{CLUSTER},reason!="gpu_idle"}})',
                                "{{reason}}",
                            )
                        ],
                        description="Number of GPUs with each clock-event reason active (idle excluded).",
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "GPUs not ok (lost or unresponsive)",
                        [
                            target(
                                f'sum by (state) (sentinel_gpu_state{{{CLUSTER},state!="ok"}})',
                                "{{state}}",
                            )
                        ],
                    ),
                    Size(12, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "GPU utilisation by host (mean)",
                        [
                            target(
                                f"avg by (host) (sentinel_gpu_utilization_ratio{{{CLUSTER}}})",
                                "{{host}}",
                            )
                        ],
                        unit="percentunit",
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "Verdicts opened per minute, by kind",
                        [
                            target(
                                f"sum by (kind) (rate(sentinel_verdicts_opened_total{{{CLUSTER}}}[{RATE}])) * 60",
                                "{{kind}}",
                            )
                        ],
                    ),
                    Size(12, 8),
                ),
            ],
            [
                (
                    table(
                        "GPUs with hardware flags",
                        "max by (host, gpu, uuid) ("
                        f"sentinel_gpu_row_remap_pending{{{CLUSTER}}} == 1"
                        f" or sentinel_gpu_row_remap_failure{{{CLUSTER}}} == 1"
                        f' or sentinel_gpu_ecc_errors{{{CLUSTER},type="uncorrected",scope="volatile"}} > 0'
                        f" or sentinel_gpu_retired_pages_pending{{{CLUSTER}}} == 1)",
                        description="Row remap pending or failed, volatile uncorrectable ECC errors, pages "
                        "pending retirement: open the GPU detail dashboard for each.",
                    ),
                    Size(24, 8),
                ),
            ],
            # the network row: IB/RoCE ports (sentinel.components.ib)
            [
                (
                    bargauge(
                        "IB/RoCE ports by state",
                        [
                            target(
                                f"sum by (state) (sentinel_ib_port_state{{{CLUSTER}}} == 1)",
                                "{{state}}",
                            )
                        ],
                        description="Every port the agents read from sysfs, by logical state.",
                    ),
                    Size(6, 8),
                ),
                (
                    timeseries(
                        "Port errors per second, by counter",
                        [
                            target(
                                f"sum by (counter) (rate(sentinel_ib_port_errors_total{{{CLUSTER},"
                                f'counter!="link_downed"}}[{RATE}]))',
                                "{{counter}}",
                            )
                        ],
                        unit="ops",
                        description="IBTA error counters (symbol, receive, integrity, discards) summed over "
                        "the fleet; a step names a marginal link: find it in the table.",
                    ),
                    Size(9, 8),
                ),
                (flaps_panel(settings), Size(9, 8)),
            ],
            [
                (
                    table(
                        "Ports not up or erroring",
                        f"max by (host, device, port) (sentinel_ib_port_up{{{CLUSTER}}} == 0)"
                        f" or max by (host, device, port) (rate(sentinel_ib_port_errors_total"
                        f"{{{CLUSTER}}}[{RATE}]) > 0)",
                        description="Down ports (including unused ones) and ports whose error counters move; "
                        "the network verdicts in the table above say which matter.",
                    ),
                    Size(24, 8),
                ),
            ],
        ],
    )

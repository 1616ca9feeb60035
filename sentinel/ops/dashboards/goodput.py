"""Goodput: the GPU time incidents cost, by cause and by phase, and the nodes and GPUs that fail most."""

from __future__ import annotations

from grafanalib.core import Dashboard

from sentinel.ops.dashboards.common import (
    CLUSTER,
    HOST,
    Size,
    bargauge,
    dashboard,
    stat,
    table,
    target,
    timeseries,
)

UID = "sentinel-goodput"
#: the window the lost-time panels add up (a day: incidents are rare)
WINDOW = "1d"


def build() -> Dashboard:
    return dashboard(
        UID,
        "sentinel / goodput",
        "What incidents cost: GPU-hours lost by cause, how long each phase of an incident takes (detect, name, "
        "drain, requeue, resume), the incidents waiting now, and the nodes and GPUs with the most incidents.",
        [
            [
                (
                    stat(
                        "GPU-hours lost (24 h)",
                        [
                            target(
                                f"sum(increase(sentinel_goodput_gpu_hours_lost_total{{{CLUSTER}}}[{WINDOW}]))",
                                "GPU-hours",
                            )
                        ],
                    ),
                    Size(6, 6),
                ),
                (
                    stat(
                        "Incidents open",
                        [target(f"sum(sentinel_incidents_open{{{CLUSTER}}})", "open")],
                        description="Incidents whose job has not moved again yet.",
                    ),
                    Size(6, 6),
                ),
                (
                    stat(
                        "Oldest wait",
                        [
                            target(
                                f"max by (step) (sentinel_incident_waiting_seconds{{{CLUSTER}}})", "{{step}}"
                            )
                        ],
                        unit="s",
                        description="The oldest open incident's wait for its drain or for its job to resume.",
                    ),
                    Size(12, 6),
                ),
            ],
            [
                (
                    bargauge(
                        "GPU-hours lost by cause (24 h)",
                        [
                            target(
                                "sort_desc(sum by (cause) (increase(sentinel_goodput_gpu_hours_lost_total"
                                f"{{{CLUSTER}}}[{WINDOW}])))",
                                "{{cause}}",
                                instant=True,
                            )
                        ],
                    ),
                    Size(12, 9),
                ),
                (
                    bargauge(
                        "Time spent per phase (24 h)",
                        [
                            target(
                                "sum by (phase) (increase(sentinel_incident_phase_seconds_sum"
                                f"{{{CLUSTER}}}[{WINDOW}]))",
                                "{{phase}}",
                                instant=True,
                            )
                        ],
                        unit="s",
                        description="Seconds all ended incidents spent in each phase, each timed from the "
                        "step before: detect (fault to first verdict), name, drain, requeue, resume.",
                    ),
                    Size(12, 9),
                ),
            ],
            [
                (
                    timeseries(
                        "Phase duration p90",
                        [
                            target(
                                "histogram_quantile(0.9, sum by (phase, le) (rate("
                                f"sentinel_incident_phase_seconds_bucket{{{CLUSTER}}}[1h])))",
                                "{{phase}}",
                            )
                        ],
                        unit="s",
                    ),
                    Size(24, 8),
                ),
            ],
            [
                (
                    table(
                        "Worst nodes by incidents",
                        f"topk(20, sum by (host) (sentinel_incidents_by_node_total{{{HOST}}}))",
                    ),
                    Size(12, 10),
                ),
                (
                    table(
                        "Worst GPUs by mean time between incidents (s)",
                        f'bottomk(20, sentinel_incident_mtbi_seconds{{{HOST},gpu!=""}})',
                    ),
                    Size(12, 10),
                ),
            ],
        ],
    )

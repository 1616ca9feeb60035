"""Building blocks shared by the dashboards: template variables, label selectors, panel helpers, layout.

Every dashboard has the same four variables (cluster, job, host, gpu) plus the data source, so a link from
one dashboard to another keeps its selection. Selectors use regex matchers with ``.*`` as the "All" value,
which also matches series whose job label is absent (GPUs with no job).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grafanalib.core import (
    BarGauge,
    Dashboard,
    DashboardLink,
    GridPos,
    Stat,
    StateTimeline,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

DATASOURCE = "${datasource}"
TAGS = ["sentinel"]

# Label selectors (inside braces) for the variables.
CLUSTER = 'cluster=~"$cluster"'
JOB = f'{CLUSTER},job=~"$job"'
HOST = f'{CLUSTER},host=~"$host"'
GPU = f'{CLUSTER},host=~"$host",gpu=~"$gpu"'

#: Grafana substitutes this in range selectors; the end-to-end test substitutes a short window.
RATE = "$__rate_interval"

#: Numeric rank/GPU state used by the job view's grid (worst wins), with the colour each gets.
STATE_VALUES: tuple[tuple[int, str, str], ...] = (
    (0, "healthy", "green"),
    (1, "straggler", "yellow"),
    (2, "degraded", "orange"),
    (3, "stuck", "purple"),
    (4, "faulty", "red"),
    (5, "lost", "dark-red"),
)


def _query_variable(name: str, label: str, query: str) -> Template:
    return Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=2,  # on time range change: new hosts/jobs appear without reloading the dashboard
    )


def templating() -> Templating:
    return Templating(
        list=[
            Template(name="datasource", label="Data source", query="prometheus", type="datasource"),
            _query_variable("cluster", "Cluster", "label_values(sentinel_gpu_info, cluster)"),
            _query_variable("job", "Job", f"label_values(sentinel_gpu_info{{{CLUSTER}}}, job)"),
            _query_variable("host", "Host", f"label_values(sentinel_gpu_info{{{CLUSTER}}}, host)"),
            _query_variable("gpu", "GPU", f'label_values(sentinel_gpu_info{{{CLUSTER},host=~"$host"}}, gpu)'),
        ]
    )


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Target:
    return Target(
        expr=expr,
        legendFormat=legend,
        instant=instant,
        format="table" if table else "time_series",
        datasource=DATASOURCE,
    )


@dataclass(frozen=True)
class Size:
    """Panel width (of 24 columns) and height (grid units)."""

    w: int = 12
    h: int = 8


def timeseries(
    title: str,
    targets: Sequence[Target],
    *,
    unit: str = "",
    description: str = "",
    stack: bool = False,
    threshold: float | None = None,
) -> TimeSeries:
    """A time series panel; ``threshold`` draws the line at which an alert fires (red from there up)."""
    steps = threshold_steps(threshold) if threshold is not None else []
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=list(targets),
        unit=unit,
        stacking={"mode": "normal", "group": "A"} if stack else {},
        legendDisplayMode="table",
        legendPlacement="right",
        thresholds=steps,
        thresholdsStyleMode="line" if steps else "off",
    )


def threshold_steps(value: float) -> list[dict[str, Any]]:
    """Grafana's threshold steps for one alerting value: green below it, red from it."""
    return [{"color": "green", "value": None}, {"color": "red", "value": value}]


def stat(title: str, targets: Sequence[Target], *, unit: str = "", description: str = "") -> Stat:
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=list(targets),
        format=unit or "none",
        reduceCalc="lastNotNull",
        graphMode="area",
    )


def table(title: str, expr: str, *, description: str = "") -> Table:
    """An instant query shown as a table: one row per series, one column per label."""
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[target(expr, instant=True, table=True)],
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
    )


def bargauge(title: str, targets: Sequence[Target], *, unit: str = "", description: str = "") -> BarGauge:
    return BarGauge(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=list(targets),
        format=unit or "none",
        displayMode="gradient",
        orientation="horizontal",
        calc="lastNotNull",
    )


def state_grid(title: str, targets: Sequence[Target], *, description: str = "") -> StateTimeline:
    """One row per series coloured by :data:`STATE_VALUES` (the job view's ranks grid)."""
    mappings: list[dict[str, Any]] = [
        {
            "type": "value",
            "options": {
                str(value): {"text": text, "color": color, "index": value}
                for value, text, color in STATE_VALUES
            },
        }
    ]
    return StateTimeline(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=list(targets),
        mappings=mappings,
        colorMode="fixed",
        showValue="never",
        rowHeight=0.9,
        mergeValues=True,
    )


def layout(rows: Sequence[Sequence[tuple[Any, Size]]]) -> list[Any]:
    """Place panels row by row on Grafana's 24-column grid; each inner sequence is one visual row."""
    placed: list[Any] = []
    y = 0
    for row in rows:
        x = 0
        height = 0
        for panel, size in row:
            if x + size.w > 24:
                x, y = 0, y + height
                height = 0
            panel.gridPos = GridPos(h=size.h, w=size.w, x=x, y=y)
            placed.append(panel)
            x += size.w
            height = max(height, size.h)
        y += height
    return placed


def dashboard(
    uid: str, title: str, description: str, rows: Sequence[Sequence[tuple[Any, Size]]]
) -> Dashboard:
    """A sentinel dashboard: shared variables, links to its siblings, last hour, 30 s refresh."""
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=TAGS,
        editable=True,
        refresh="30s",
        time=Time("now-1h", "now"),
        timezone="browser",
        templating=templating(),
        links=[
            DashboardLink(
                title="sentinel",
                type="dashboards",
                tags=TAGS,
                asDropdown=True,
                keepTime=True,
                includeVars=True,
            )
        ],
        panels=layout(rows),
    ).auto_panel_ids()

"""The Xid component's family: occurrences per GPU and code, labelled with the catalog's severity.

Alert rules match ``severity="critical"`` instead of a list of codes: the catalog
(:mod:`sentinel.components.xid.catalog`) stays the only place that decides which codes are critical.
"""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer


def render(out: Writer, view: MetricsView) -> None:
    name = "sentinel_gpu_xid_events_total"
    out.family(name, "counter", "Xid events seen, by code and the catalog's severity for it")
    for row in view.rows:
        for (code, severity), count in sorted(row.xids.items()):
            out.line(name, row.labels, float(count), f'xid="{code}",severity="{severity}"')

"""The fabric component's family: registration state with the fabric manager."""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer

STATES = ("not_started", "in_progress", "completed")


def render(out: Writer, view: MetricsView) -> None:
    rows = [(s.fabric, lab) for s, lab in view.slow() if s.fabric is not None]
    out.family("sentinel_gpu_fabric_state", "gauge", "1 for the GPU's fabric-manager registration state")
    for info, lab in rows:
        for state in STATES:
            out.line(
                "sentinel_gpu_fabric_state", lab, 1.0 if info.state == state else 0.0, f'state="{state}"'
            )
    out.family("sentinel_gpu_fabric_clique", "gauge", "the GPU's NVLink clique (fabric domain) id")
    for info, lab in rows:
        out.line("sentinel_gpu_fabric_clique", lab, float(info.clique_id))

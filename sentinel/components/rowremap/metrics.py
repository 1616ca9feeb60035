"""The row-remap component's families: remapped rows, pending, failure, bank availability."""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer


def render(out: Writer, view: MetricsView) -> None:
    remaps = [(sample.remap, lab) for sample, lab in view.slow() if sample.remap is not None]
    out.family("sentinel_gpu_remapped_rows", "gauge", "rows remapped")
    for r, lab in remaps:
        for value, kind in ((r.correctable, "correctable"), (r.uncorrectable, "uncorrectable")):
            if value is not None:
                out.line("sentinel_gpu_remapped_rows", lab, float(value), f'type="{kind}"')
    out.family("sentinel_gpu_row_remap_pending", "gauge", "1 when a row remap waits for a GPU reset")
    for r, lab in remaps:
        out.line("sentinel_gpu_row_remap_pending", lab, 1.0 if r.pending else 0.0)
    out.family("sentinel_gpu_row_remap_failure", "gauge", "1 when row remapping failed (RMA)")
    for r, lab in remaps:
        out.line("sentinel_gpu_row_remap_failure", lab, 1.0 if r.failure else 0.0)
    name = "sentinel_gpu_row_remap_bank_availability"
    out.family(name, "gauge", "row-remapper histogram: banks by spare rows left")
    for r, lab in remaps:
        for level, value in (
            ("max", r.hist_max),
            ("high", r.hist_high),
            ("partial", r.hist_partial),
            ("low", r.hist_low),
            ("none", r.hist_none),
        ):
            if value is not None:
                out.line(name, lab, float(value), f'level="{level}"')

"""The ECC component's families: error counters by type and scope, by location, and retired pages."""

from __future__ import annotations

from sentinel.components.exposition import MetricsView, Writer


def render(out: Writer, view: MetricsView) -> None:
    slow = view.slow()
    out.family("sentinel_gpu_ecc_errors", "gauge", "ECC error counters (volatile resets at driver load)")
    for sample, lab in slow:
        e = sample.ecc
        if e is None:
            continue
        for value, extra in (
            (e.volatile_corrected, 'type="corrected",scope="volatile"'),
            (e.volatile_uncorrected, 'type="uncorrected",scope="volatile"'),
            (e.aggregate_corrected, 'type="corrected",scope="aggregate"'),
            (e.aggregate_uncorrected, 'type="uncorrected",scope="aggregate"'),
        ):
            if value is not None:
                out.line("sentinel_gpu_ecc_errors", lab, float(value), extra)
    name = "sentinel_gpu_ecc_uncorrected_location_errors"
    out.family(name, "gauge", "aggregate uncorrected ECC errors by memory location")
    for sample, lab in slow:
        e = sample.ecc
        if e is None:
            continue
        for value, location in ((e.sram_uncorrected, "sram"), (e.dram_uncorrected, "dram")):
            if value is not None:
                out.line(name, lab, float(value), f'location="{location}"')
    retired = [(sample.retired, lab) for sample, lab in slow if sample.retired is not None]
    out.family("sentinel_gpu_retired_pages", "gauge", "retired memory pages")
    for p, lab in retired:
        if p.single_bit is not None:
            out.line("sentinel_gpu_retired_pages", lab, float(p.single_bit), 'cause="single_bit"')
        if p.double_bit is not None:
            out.line("sentinel_gpu_retired_pages", lab, float(p.double_bit), 'cause="double_bit"')
    out.family("sentinel_gpu_retired_pages_pending", "gauge", "1 when a page retirement waits for a reset")
    for p, lab in retired:
        out.line("sentinel_gpu_retired_pages_pending", lab, 1.0 if p.pending else 0.0)

"""The retired_pages signal: pre-Ampere page retirement judged through the engine (pending → reset, the
limit → RMA), and nothing judged where the GPU remaps rows instead (no reading)."""

from __future__ import annotations

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.state import HostView
from sentinel.wire import Batch, GpuInfo, GpuSample, Hello, RetiredPages


def _host(engine: Engine) -> HostView:
    return engine.hello(Hello(host="v100", gpus=[GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00")]), 0.0)


def _verdicts(engine: Engine) -> set[tuple[str, str, str]]:
    return {(v.kind, v.reason, v.action) for v in engine.book.open.values()}


def test_a_pending_retirement_asks_for_a_reset_and_clears_after_it() -> None:
    engine = Engine()
    host = _host(engine)
    pending = RetiredPages(single_bit=1, double_bit=2, pending=True)
    engine.ingest(host, Batch(seq=0, t=1.0, samples=[GpuSample(gpu=0, t=1.0, retired=pending)]), 1.0)
    assert _verdicts(engine) == {("degraded", "retired_pages_pending", "reset_gpu")}
    done = RetiredPages(single_bit=1, double_bit=2, pending=False)
    engine.ingest(host, Batch(seq=1, t=2.0, samples=[GpuSample(gpu=0, t=2.0, retired=done)]), 2.0)
    assert _verdicts(engine) == set()


def test_retired_pages_at_the_limit_are_an_rma() -> None:
    engine = Engine()
    host = _host(engine)
    limit = engine.config.detect.ecc.retired_pages_rma
    worn = RetiredPages(single_bit=limit - 20, double_bit=20, pending=False)
    engine.ingest(host, Batch(seq=0, t=1.0, samples=[GpuSample(gpu=0, t=1.0, retired=worn)]), 1.0)
    [verdict] = engine.book.open.values()
    assert (verdict.kind, verdict.reason, verdict.action) == ("faulty", "retired_pages_limit", "rma")
    assert any(f"{limit} retired pages >= limit {limit}" in line for line in verdict.evidence)


def test_one_page_short_of_the_limit_is_fit() -> None:
    engine = Engine()
    host = _host(engine)
    limit = engine.config.detect.ecc.retired_pages_rma
    many = RetiredPages(single_bit=limit - 1, double_bit=0, pending=False)
    engine.ingest(host, Batch(seq=0, t=1.0, samples=[GpuSample(gpu=0, t=1.0, retired=many)]), 1.0)
    assert _verdicts(engine) == set()


def test_a_gpu_that_remaps_rows_has_no_retired_pages_to_judge() -> None:
    engine = Engine()
    host = _host(engine)
    engine.ingest(host, Batch(seq=0, t=1.0, samples=[GpuSample(gpu=0, t=1.0, retired=None)]), 1.0)
    assert _verdicts(engine) == set()

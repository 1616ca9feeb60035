"""The rowremap and ecc signals through the engine: pending, failed and rising remaps; ECC errors."""

from __future__ import annotations

from sentinel.wire import (
    EccCounters,
    GpuWasReset,
    RowRemap,
)
from tests.aggregator.helpers import Fleet, sample


def test_row_remap_pending_failure_and_ecc() -> None:
    f = Fleet()
    healthy = {"remap": RowRemap(), "ecc": EccCounters(volatile_uncorrected=0)}
    f.send("h0", 1.0, samples=[sample(i, 1.0, **healthy) for i in range(8)])
    assert f.open() == []
    samples = [sample(i, 2.0, **healthy) for i in range(8)]
    samples[0] = sample(0, 2.0, remap=RowRemap(correctable=1, pending=True))
    samples[1] = sample(1, 2.0, remap=RowRemap(uncorrectable=2, failure=True))
    samples[2] = sample(2, 2.0, ecc=EccCounters(volatile_uncorrected=3))
    samples[3] = sample(3, 2.0, remap=RowRemap(uncorrectable=1, pending=True))
    f.send("h0", 2.0, samples=samples)
    # the signals rules: pending with an uncorrectable remap is faulty until the reset, correctable-only degraded
    assert f.open() == [
        ("degraded", "h0", 0, "row_remap_pending"),
        ("faulty", "h0", 1, "row_remap_failure"),
        ("faulty", "h0", 2, "ecc_uncorrected_volatile"),
        ("faulty", "h0", 3, "row_remap_pending_uncorrectable"),
    ]
    actions = {v.gpu: v.action for v in f.engine.book.open.values()}
    assert actions == {0: "reset_gpu", 1: "rma", 2: "reset_gpu", 3: "reset_gpu"}
    # the GPU resets applied the remaps and cleared the volatile counters
    samples = [sample(i, 3.0, **healthy) for i in range(8)]
    samples[0] = sample(0, 3.0, remap=RowRemap(correctable=1))
    samples[1] = sample(1, 3.0, remap=RowRemap(uncorrectable=2, failure=True))
    samples[3] = sample(3, 3.0, remap=RowRemap(uncorrectable=1))
    resets = [GpuWasReset(t=3.0, gpu=g) for g in (0, 2, 3)]
    f.send("h0", 3.0, samples=samples, events=resets)
    assert f.open() == [("faulty", "h0", 1, "row_remap_failure")]

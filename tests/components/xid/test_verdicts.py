"""The xid signal through the engine: a fatal Xid faulty at once, repeats degraded, latched until a reset."""

from __future__ import annotations

import msgspec

from sentinel.components.xid.parse import xid_record
from sentinel.wire import (
    EccCounters,
    GpuStateChanged,
    GpuWasReset,
    XidOccurred,
)
from tests.aggregator.helpers import Fleet, kernel_xid, sample


def test_critical_xid_opens_faulty_in_the_same_ingest_and_closes_on_reset() -> None:
    f = Fleet()
    f.send("h0", 1.0)
    f.send(
        "h0",
        2.0,
        events=[kernel_xid(2.0, 3, 79)],
    )
    assert f.open() == [("faulty", "h0", 3, "xid_79")]  # before any tick
    verdict = next(iter(f.engine.book.open.values()))
    assert verdict.action == "reboot" and verdict.opened_at == 2.0
    assert any("NVIDIA: RESTART_BM (investigate: " in line for line in verdict.evidence)  # NVIDIA's bucket
    for t in range(3, 8):
        f.send("h0", float(t))
        f.engine.tick(float(t))
    assert len(f.engine.book.open) == 1 and len(f.engine.book.by_id) == 1  # opened once
    f.send("h0", 8.0, events=[GpuWasReset(t=8.0, gpu=3)])
    assert f.open() == []
    assert verdict.state == "closed" and verdict.closed_at == 8.0


def test_latched_xid_survives_an_nvml_stall_and_clears_only_on_reset_evidence() -> None:
    f = Fleet()
    f.send(
        "h0",
        1.0,
        events=[kernel_xid(1.0, 2, 48)],
    )
    assert f.open() == [("faulty", "h0", 2, "xid_48")]
    # a 2-second NVML stall: unresponsive, then the agent's "recovered" (previous unresponsive)
    stalled = [sample(i, 2.0, state="unresponsive" if i == 2 else "ok") for i in range(8)]
    f.send("h0", 2.0, samples=stalled)
    events = [GpuStateChanged(t=4.0, gpu=2, state="ok", previous="unresponsive")]
    f.send("h0", 4.0, events=events)
    f.engine.tick(5.0)
    assert ("faulty", "h0", 2, "xid_48") in f.open()
    # the volatile ECC counters restarting is a reset (they only restart at a GPU reset / driver reload)
    f.send("h0", 6.0, samples=[sample(i, 6.0, ecc=EccCounters(volatile_corrected=9)) for i in range(8)])
    f.send("h0", 7.0, samples=[sample(i, 7.0, ecc=EccCounters(volatile_corrected=0)) for i in range(8)])
    f.engine.tick(8.0)
    assert f.open() == []


def test_application_xids_never_make_a_gpu_faulty_but_repeats_from_many_processes_degrade_it() -> None:
    f = Fleet()
    for i, xid in enumerate((13, 31, 43, 45)):
        f.send(
            "h0",
            1.0 + i,
            events=[XidOccurred(t=1.0 + i, gpu=1, record=msgspec.structs.replace(xid_record(xid), pid=100))],
        )
    assert f.open() == []
    for i, pid in enumerate((101, 102)):
        f.send(
            "h0",
            10.0 + i,
            events=[XidOccurred(t=10.0 + i, gpu=1, record=msgspec.structs.replace(xid_record(13), pid=pid))],
        )
    assert f.open() == [("degraded", "h0", 1, "xid_13_repeated")]
    assert all(v.kind != "faulty" for v in f.engine.book.all())

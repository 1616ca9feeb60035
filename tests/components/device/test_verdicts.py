"""The device signal through the engine: lost and unresponsive GPUs, and a lost GPU named by its Xid."""

from __future__ import annotations

import pytest

from sentinel.components.xid.parse import xid_record
from sentinel.wire import (
    GpuSample,
    GpuStateChanged,
    XidOccurred,
)
from tests.aggregator.helpers import Fleet, kernel_xid, sample


def test_a_lost_gpu_answering_again_was_reset() -> None:
    f = Fleet()
    f.send(
        "h0",
        1.0,
        events=[kernel_xid(1.0, 4, 79)],
    )
    f.send("h0", 2.0, events=[GpuStateChanged(t=2.0, gpu=4, state="ok", previous="lost")])
    f.engine.tick(3.0)
    assert f.open() == []


def _lost(t: float, gpu: int, *, unresponsive: int | None = None) -> list[GpuSample]:
    states = {gpu: "lost"} | ({unresponsive: "unresponsive"} if unresponsive is not None else {})
    return [sample(i, t, state=states.get(i, "ok")) for i in range(8)]


def test_lost_and_unresponsive_gpus() -> None:
    f = Fleet()
    f.send("h0", 1.0, samples=_lost(1.0, 6, unresponsive=7))
    # a lost GPU waits lost_cause_wait_s (2 s of the agent's reporting) for an Xid that would explain it
    assert f.open() == [("faulty", "h0", 7, "gpu_unresponsive")]
    f.send("h0", 2.0, samples=_lost(2.0, 6, unresponsive=7))
    f.engine.tick(2.0)
    assert ("faulty", "h0", 6, "gpu_lost") not in f.open()
    f.send("h0", 3.0, samples=_lost(3.0, 6, unresponsive=7))
    f.engine.tick(3.0)  # the held GPU is re-checked on the tick
    assert f.open() == [("faulty", "h0", 6, "gpu_lost"), ("faulty", "h0", 7, "gpu_unresponsive")]
    lost = next(v for v in f.engine.book.open.values() if v.gpu == 6)
    assert lost.evidence_t == 1.0 and lost.action == "reboot"
    f.send("h0", 4.0)  # both answer again
    assert f.open() == []


@pytest.mark.parametrize("then", ["other_gpus_only", "nothing"])
def test_a_lost_gpu_is_named_after_its_wait_when_its_host_sends_no_more_of_it(then: str) -> None:
    """The wait is re-checked on the tick, and ends on the aggregator's clock when the agent goes quiet."""
    f = Fleet()
    f.send("h0", 1.0, samples=_lost(1.0, 2))
    for t in (2.0, 3.0):
        if then == "other_gpus_only":
            f.send("h0", t, samples=[sample(i, t) for i in range(8) if i != 2])
        f.engine.tick(t)
    assert f.open() == [("faulty", "h0", 2, "gpu_lost")]
    for t in (4.0, 5.0):  # and it stays open: no second wait
        f.engine.tick(t)
        assert f.open() == [("faulty", "h0", 2, "gpu_lost")]
    assert len(f.engine.book.by_id) == 1


XID_79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize("order", ["lost_first", "xid_first", "same_batch"])
def test_xid_79_names_a_lost_gpus_verdict_whatever_the_arrival_order(order: str) -> None:
    """NVML's lost state is the symptom of Xid 79: the one verdict names the Xid, the lost state as evidence.

    The agent holds an NVML-only Xid up to xid_merge_wait_s for its kernel twin, so the lost state (on the
    next sample) often arrives first; the verdict must not be named by whichever came first.
    """
    f = Fleet()
    f.send("h0", 0.0)
    xid = XidOccurred(t=1.0, gpu=5, text=XID_79, record=xid_record(79, XID_79))

    def lost(t: float) -> GpuStateChanged:
        return GpuStateChanged(t=t, gpu=5, state="lost", previous="ok")

    # order -> {time: (events arriving then, whether the GPU reads lost from then on)}
    schedules: dict[str, dict[float, tuple[list[XidOccurred | GpuStateChanged], bool]]] = {
        "lost_first": {1.0: ([lost(1.0)], True), 3.0: ([xid], True)},
        "xid_first": {1.0: ([xid], False), 2.0: ([lost(2.0)], True)},
        "same_batch": {1.0: ([lost(1.0), xid], True)},
    }
    arrivals = schedules[order]
    is_lost = False
    for step in range(1, 9):
        t = float(step)
        events, is_lost = arrivals.get(t, ([], is_lost))
        f.send("h0", t, samples=_lost(t, 5) if is_lost else None, events=events)
        f.engine.tick(t)
        assert all(v.reason == "xid_79" for v in f.engine.book.by_id.values()), (t, f.open())
    assert f.open() == [("faulty", "h0", 5, "xid_79")]
    assert len(f.engine.book.by_id) == 1  # opened once, never renamed
    (verdict,) = f.engine.book.open.values()
    assert verdict.action == "reboot" and verdict.evidence_t == 1.0
    assert "NVML: GPU is lost (fallen off the bus)" in verdict.evidence
    assert any("pid=4242" in line for line in verdict.evidence)


@pytest.mark.parametrize("code", [13, 48])
def test_a_lost_gpu_whose_xids_do_not_say_it_fell_off_the_bus_is_gpu_lost(code: int) -> None:
    """An application Xid, or a fatal double-bit error: neither explains NVML losing the GPU."""
    f = Fleet()
    text = f"NVRM: Xid (PCI:0000:1b:00): {code}, pid=7, name=python, x"
    xid = XidOccurred(t=1.0, gpu=1, text=text, record=xid_record(code, text))
    f.send("h0", 1.0, samples=_lost(1.0, 1), events=[xid])
    for t in (2.0, 3.0, 4.0):
        f.send("h0", t, samples=_lost(t, 1))
        f.engine.tick(t)
    assert f.open() == [("faulty", "h0", 1, "gpu_lost")]

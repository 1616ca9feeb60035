"""NVML + kernel-log reports of one Xid: one event, the kernel line's detail, NVML's timing, bounded wait."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.xid.merge import XidMerger, XidReport

LINE_149 = "NVRM: Xid (PCI:0000:3b:00): 149, pid=4242, name=python3, Nonfatal NETIR_LINK_EVT, Link 02"


def nvml(t: float, gpu: int = 0, xid: int = 149) -> XidReport:
    return XidReport(gpu=gpu, xid=xid, t=t, source="nvml")


def kernel(t: float, gpu: int = 0, xid: int = 149, text: str = LINE_149) -> XidReport:
    return XidReport(gpu=gpu, xid=xid, t=t, source="kmsg", text=text, pci_bus="0000:3b:00")


def test_nvml_first_then_kernel_line_is_one_event_with_kernel_detail_and_nvml_time() -> None:
    m = XidMerger(wait_s=2.0)
    assert m.offer(nvml(10.0), now=10.0) == []  # waits for its twin
    [event] = m.offer(kernel(10.7), now=10.7)
    assert (event.t, event.text, event.source, event.merged) == (10.0, LINE_149, "kmsg", True)
    assert m.due(100.0) == []


def test_kernel_first_then_nvml_is_one_event_too() -> None:
    m = XidMerger(wait_s=2.0)
    assert m.offer(kernel(5.4), now=5.4) == []
    [event] = m.offer(nvml(5.1), now=5.5)
    assert (event.t, event.text) == (5.1, LINE_149)


def test_a_lonely_report_is_sent_after_the_bounded_wait_and_its_late_twin_is_dropped() -> None:
    m = XidMerger(wait_s=2.0, window_s=10.0)
    m.offer(nvml(1.0), now=1.0)
    assert m.due(2.9) == []
    [alone] = m.due(3.0)
    assert alone.source == "nvml" and not alone.merged
    assert m.offer(kernel(4.0), now=4.0) == []  # the same occurrence, late: not a second event
    assert m.late_twins == 1


def test_distinct_occurrences_and_gpus_stay_apart() -> None:
    m = XidMerger(wait_s=2.0, window_s=2.0)
    m.offer(nvml(1.0, gpu=0), now=1.0)
    m.offer(nvml(1.0, gpu=1), now=1.0)
    out = m.offer(nvml(1.5, gpu=0), now=1.5)  # NVML again on GPU 0: the first was its own occurrence
    assert [(r.gpu, r.t) for r in out] == [(0, 1.0)]
    assert sorted((r.gpu, r.t) for r in m.due(10.0)) == [(0, 1.5), (1, 1.0)]
    late = m.offer(kernel(60.0, gpu=1), now=60.0)  # outside the window: a new occurrence, not a twin
    assert late == [] and len(m) == 1


def test_kernel_line_for_an_unknown_gpu_is_not_held() -> None:
    m = XidMerger()
    [event] = m.offer(kernel(1.0, gpu=-1), now=1.0)
    assert event.gpu == -1


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([13, 48, 79]), st.booleans(), st.floats(0, 100)),
        max_size=60,
    )
)
def test_nothing_is_lost_and_pending_stays_bounded(reports: list[tuple[int, int, bool, float]]) -> None:
    m = XidMerger(wait_s=1.0, window_s=5.0, max_pending=4)
    emitted = 0
    for gpu, xid, from_nvml, t in sorted(reports, key=lambda r: r[3]):
        r = nvml(t, gpu, xid) if from_nvml else kernel(t, gpu, xid, text=f"NVRM: Xid (PCI:0000:3b:00): {xid}")
        emitted += len(m.offer(r, now=t))
        assert len(m) <= 4
    emitted += len(m.due(1e9))
    # every report is an event, half of a merged pair, or a recognised late twin
    assert emitted + m.merged + m.late_twins == len(reports)

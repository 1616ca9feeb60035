"""Xid floods (pure, times passed in): the first occurrence goes at once, the repeats within the window as one
report with their count, one per window while the flood lasts; the signal keeps one verdict with the count."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.components.gpu_view import GpuView, apply_gpu_event
from sentinel.components.hardware import judge_gpu
from sentinel.components.signal import JudgeSettings
from sentinel.components.xid.flood import XidFlood
from sentinel.components.xid.parse import parse_xid
from sentinel.wire import XidOccurred

KEY = (0, 95, 4242, "Uncontained memory error")


def test_the_first_goes_at_once_the_repeats_once_per_window() -> None:
    flood: XidFlood[str] = XidFlood(window_s=10.0)
    assert flood.offer(KEY, "first", 0.0) == (True, [])
    for k in range(1, 1000):
        assert flood.offer(KEY, f"line {k}", k / 100) == (False, [])
    assert flood.due(9.9) == []
    assert flood.due(10.0) == [("line 999", 999)]
    flood.offer(KEY, "more", 15.0)  # the flood goes on: counted into the next window, not sent
    assert flood.due(19.0) == []
    assert flood.due(20.0) == [("more", 1)]
    assert flood.due(40.0) == [] and len(flood) == 0  # a window without repeats: the flood is over
    assert flood.offer(KEY, "again", 41.0) == (True, [])  # and the line is news again
    assert flood.coalesced == 1000


def test_other_gpus_codes_and_processes_are_other_floods() -> None:
    flood: XidFlood[int] = XidFlood(window_s=10.0)
    keys = [KEY, (1, 95, 4242, KEY[3]), (0, 48, 4242, "DBE"), (0, 95, 5000, KEY[3])]
    assert [flood.offer(key, i, 1.0)[0] for i, key in enumerate(keys)] == [True] * 4


def test_the_last_flush_releases_everything_and_zero_turns_it_off() -> None:
    flood: XidFlood[int] = XidFlood(window_s=10.0)
    flood.offer(KEY, 1, 0.0)
    flood.offer(KEY, 2, 1.0)
    assert flood.due(math.inf) == [(2, 1)] and len(flood) == 0
    off: XidFlood[int] = XidFlood(window_s=0.0)
    assert all(off.offer(KEY, i, 0.0)[0] for i in range(5)) and len(off) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.floats(0.0, 100.0, allow_nan=False)), max_size=300),
    st.integers(1, 8),
)
def test_bounded_and_no_occurrence_is_lost(offers: list[tuple[int, float]], max_keys: int) -> None:
    flood: XidFlood[int] = XidFlood(window_s=5.0, max_keys=max_keys)
    sent = 0
    for gpu, t in sorted(offers, key=lambda o: o[1]):
        now, pushed = flood.offer((gpu, 95, None, ""), gpu, t)
        sent += int(now) + sum(n for _, n in pushed)
        assert len(flood) <= max_keys
    sent += sum(n for _, n in flood.due(math.inf))
    assert sent == len(offers)


def test_a_flood_at_the_aggregator_is_one_verdict_with_its_count() -> None:
    record = parse_xid("NVRM: Xid (PCI:0000:18:00): 95, pid=4242, name=python3, Uncontained memory error")
    assert record is not None
    gpu = GpuView(host="h", index=0)
    settings_ = JudgeSettings()
    dirty: list[GpuView] = []
    first = XidOccurred(t=1.0, source="kmsg", gpu=0, severity="critical", text="", record=record)
    apply_gpu_event(gpu, first, settings_, dirty)
    for k in range(80):  # 80 windows of 10,000 repeats: 800,001 occurrences in 81 events
        repeats = XidOccurred(
            t=11.0 + 10 * k, source="kmsg", gpu=0, severity="critical", text="", record=record, count=10_000
        )
        apply_gpu_event(gpu, repeats, settings_, dirty)
    (judged,) = judge_gpu(gpu, settings_, 900.0)
    assert (judged.finding.state, judged.finding.reason, judged.finding.action) == (
        "faulty",
        "xid_95",
        "reset_gpu",
    )
    assert "Xid 95 x800001" in judged.finding.evidence[0]
    assert len(gpu.memory["xid"].evidence) <= 16 and len(gpu.memory["xid"].history) <= 16

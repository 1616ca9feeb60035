"""The hold-down memory on its own: per (node, GPU, reason), within the window, bounded."""

from __future__ import annotations

from sentinel.aggregator.remediation.flapping import MAX_KEYS, HoldDown


def test_held_after_n_drains_of_the_same_gpu_and_reason_within_the_window() -> None:
    hold = HoldDown(drains=3, window_s=100.0)
    assert hold.drained("n1", 3, "xid_79", 0.0) is None
    assert hold.drained("n1", 4, "xid_79", 10.0) is None  # another GPU: its own count
    assert hold.drained("n1", 3, "xid_48", 20.0) is None  # another reason: its own count
    assert hold.drained("n1", 3, "xid_79", 30.0) is None
    held = hold.drained("n1", 3, "xid_79", 60.0)
    assert held is not None and (held.gpu, held.reason, held.drains, held.first_t) == (3, "xid_79", 3, 0.0)
    assert hold.held("n1", 99.0) == held and hold.held("n2", 99.0) is None
    assert hold.held_nodes(99.0) == {"n1"}
    assert hold.held("n1", 100.1) is None  # the first drain left the window: two in it, not held
    assert hold.held_nodes(200.0) == set()


def test_zero_turns_it_off_and_memory_is_bounded() -> None:
    off = HoldDown(drains=0, window_s=100.0)
    assert all(off.drained("n", 0, "r", float(t)) is None for t in range(10))
    hold = HoldDown(drains=2, window_s=1e9)
    for i in range(MAX_KEYS + 50):
        hold.drained(f"n{i}", 0, "r", float(i))
    assert len(hold._times) == MAX_KEYS
    assert hold.held("n0", 1.0) is None  # the oldest were dropped first

"""Xid bursts (pure, times passed in): the origin is the first report of the strongest kind, the application
and sympathetic reports on other GPUs are its echoes, a burst reaching ``min_gpus`` GPUs is a storm."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.components.xid.storm import MAX_MEMBERS, SYMPATHETIC_CODES, XidStorms, strength


def storms(window_s: float = 10.0, min_gpus: int = 4, max_storms: int = 1024) -> XidStorms:
    return XidStorms(window_s=window_s, min_gpus=min_gpus, max_storms=max_storms)


def test_the_sympathetic_codes_are_nvidias() -> None:
    assert {94, 95} <= SYMPATHETIC_CODES and 79 not in SYMPATHETIC_CODES and 45 not in SYMPATHETIC_CODES
    assert (strength(45), strength(95), strength(79)) == (0, 1, 2)


def test_the_first_report_is_the_origin_and_the_others_its_echoes() -> None:
    tracker = storms()
    roles = [
        tracker.observe("job:a", "a", host=f"h{g // 8}", gpu=g % 8, code=45, t=100.0 + g / 10, now=100.0)[0]
        for g in range(16)
    ]
    assert roles == ["origin"] + ["sympathetic"] * 15
    (storm,) = tracker.storms(101.0)
    assert (storm.origin.host, storm.origin.gpu, storm.gpu_count, len(storm.hosts)) == ("h0", 0, 16, 2)
    assert (storm.reports, storm.sympathetic, storm.codes) == (16, 15, {45: 16})


def test_a_burst_under_min_gpus_is_no_storm_but_its_echoes_are_still_echoes() -> None:
    tracker = storms(min_gpus=4)
    assert tracker.observe("job:a", "a", host="h", gpu=0, code=95, t=1.0, now=1.0)[0] == "origin"
    assert tracker.observe("job:a", "a", host="h", gpu=1, code=95, t=1.5, now=1.5)[0] == "sympathetic"
    assert tracker.storms(2.0) == []


def test_a_stronger_report_takes_the_origin_and_an_own_error_is_judged() -> None:
    tracker = storms()
    tracker.observe("job:a", "a", host="h", gpu=0, code=45, t=1.0, now=1.0)
    assert tracker.observe("job:a", "a", host="h", gpu=1, code=95, t=1.1, now=1.1)[0] == "origin"
    assert tracker.observe("job:a", "a", host="h", gpu=2, code=79, t=1.2, now=1.2)[0] == "origin"
    assert tracker.observe("job:a", "a", host="h", gpu=3, code=48, t=1.3, now=1.3)[0] == "own"
    assert tracker.observe("job:a", "a", host="h", gpu=4, code=95, t=1.4, now=1.4)[0] == "sympathetic"
    burst = tracker.bursts["job:a"]
    assert (burst.origin.gpu, burst.origin.code) == (2, 79)


def test_a_sympathetic_report_echoes_only_its_own_hosts_first_error() -> None:
    """Another host's earlier error cannot explain away an uncontained error here; a teardown spreads."""
    tracker = storms()
    tracker.observe("job:a", "a", host="liar", gpu=0, code=79, t=1.0, now=1.0)
    role, burst = tracker.observe("job:a", "a", host="h", gpu=3, code=95, t=1.2, now=1.2)
    assert role == "own"  # the first hardware report of its host: judged
    assert tracker.observe("job:a", "a", host="h", gpu=5, code=95, t=1.3, now=1.3)[0] == "sympathetic"
    assert (burst.echoed("h", 95).host, burst.echoed("h", 95).gpu) == ("h", 3)
    assert tracker.observe("job:a", "a", host="liar", gpu=1, code=95, t=1.3, now=1.3)[0] == "sympathetic"
    assert tracker.observe("job:a", "a", host="h", gpu=4, code=45, t=1.4, now=1.4)[0] == "sympathetic"
    assert burst.echoed("h", 45).host == "liar"
    assert (burst.origin.host, burst.sympathetic, burst.reports) == ("liar", 3, 5)


def test_an_earlier_report_arriving_late_is_the_origin() -> None:
    """Hosts' batches arrive in any order: of reports of one kind, the earliest is the origin."""
    tracker = storms()
    tracker.observe("job:a", "a", host="h1", gpu=0, code=45, t=5.0, now=5.0)
    assert tracker.observe("job:a", "a", host="h0", gpu=3, code=45, t=4.2, now=5.1)[0] == "origin"
    assert tracker.bursts["job:a"].origin.host == "h0"


def test_scopes_are_apart_and_a_quiet_window_ends_a_burst() -> None:
    tracker = storms(window_s=10.0, min_gpus=2)
    tracker.observe("job:a", "a", host="h", gpu=0, code=45, t=1.0, now=1.0)
    assert tracker.observe("job:b", "b", host="h2", gpu=0, code=45, t=1.1, now=1.1)[0] == "origin"
    tracker.observe("job:a", "a", host="h", gpu=1, code=45, t=2.0, now=2.0)
    assert [s.scope for s in tracker.storms(5.0)] == ["job:a"]
    assert tracker.storms(12.5) == []  # nothing for more than the window: over, forgotten
    assert tracker.bursts == {}
    # a report long after the burst it would have joined starts a new one
    tracker.observe("job:a", "a", host="h", gpu=0, code=45, t=100.0, now=100.0)
    assert tracker.observe("job:a", "a", host="h", gpu=1, code=45, t=200.0, now=200.0)[0] == "origin"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # scope
            st.integers(0, 3),  # host
            st.integers(0, 7),  # gpu
            st.sampled_from([13, 31, 43, 45, 48, 79, 94, 95, 119]),
            st.floats(0.0, 60.0, allow_nan=False),
        ),
        max_size=200,
    )
)
def test_bounded_and_the_origin_is_never_weaker_than_a_report_it_leads(
    reports: list[tuple[int, int, int, int, float]],
) -> None:
    tracker = storms(max_storms=3)
    for scope, host, gpu, code, t in reports:
        role, burst = tracker.observe(
            f"job:{scope}", str(scope), host=f"h{host}", gpu=gpu, code=code, t=t, now=t
        )
        assert role in ("origin", "sympathetic", "own")
        if role == "sympathetic":
            assert strength(code) <= strength(burst.origin.code) and strength(code) < 2
            # a sympathetic report echoes an earlier or stronger hardware report of its own host
            echoed = burst.echoed(f"h{host}", code)
            assert strength(code) == 0 or (echoed.host == f"h{host}" and echoed.gpu != gpu)
        assert len(tracker.bursts) <= 3
        assert burst.gpu_count <= min(MAX_MEMBERS, 32) and burst.reports >= burst.sympathetic

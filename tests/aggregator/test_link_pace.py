"""The link-pace detector's step clock: seconds per step from the step group's progress points."""

from __future__ import annotations

import pytest

from sentinel.aggregator.detectors.link_pace import step_time


def test_step_time_is_the_slope_through_coarse_progress_points() -> None:
    # a 0.8 s step seen through heads every ~2 s: each point is when a new completed seq was reported
    points = [(t, int(t / 0.8)) for t in (0.0, 2.1, 3.9, 6.2, 8.0, 10.1, 11.9, 14.0, 16.1, 18.0)]
    assert step_time(points, 18.5) == pytest.approx(0.8, rel=0.05)


def test_a_job_that_stopped_completing_steps_is_slower_by_its_wait() -> None:
    points = [(float(t), t) for t in range(10)]  # one step per second until t = 9, then nothing
    assert step_time(points, 9.5) == pytest.approx(1.0)
    assert step_time(points, 20.0) is not None and step_time(points, 20.0) > 1.5  # type: ignore[operator]


def test_no_progress_no_step_time() -> None:
    assert step_time([(1.0, 5), (1.0, 5)], 2.0) is None
    assert step_time([(1.0, 5), (3.0, 5)], 3.0) is None

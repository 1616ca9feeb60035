"""The straggler's clock gate: a host's ranks are judged by compute time once its clock rate is known to be
within ``max_clock_rate_error``, which takes two measurement windows, not the five minutes of the rate metric."""

from __future__ import annotations

import math
import random

from sentinel.aggregator.clock import GATE_SPAN_S, WINDOW_S, HostClock

GATE = 0.02  # detect.straggler.max_clock_rate_error's default


def _feed(rate: float, seconds: int, jitter_s: float, seed: int = 3) -> list[float]:
    """A host stamping a batch every second with a clock at ``rate``; the rate error bound each second."""
    rng = random.Random(seed)
    clock = HostClock()
    bounds = []
    for t in range(seconds):
        clock.observe(t * rate + 1000.0, t + rng.uniform(0.0, jitter_s))
        bounds.append(clock.rate_error())
    return bounds


def test_an_honest_clock_passes_the_gate_after_two_windows_not_after_the_rate_metric_s_span() -> None:
    bounds = _feed(1.0, 60, jitter_s=0.02)
    first = next(t for t, b in enumerate(bounds) if b <= GATE)
    assert GATE_SPAN_S + WINDOW_S <= first <= GATE_SPAN_S + 2 * WINDOW_S  # 20-30 s, was 40-50 s
    assert all(math.isinf(b) for b in bounds[: int(GATE_SPAN_S + WINDOW_S)])
    assert all(b <= GATE for b in bounds[first:])


def test_a_clock_off_by_more_than_the_gate_never_passes_it_and_one_near_it_only_once_measured_long_enough() -> (
    None
):
    assert all(b > GATE for b in _feed(1.03, 300, jitter_s=0.05))
    assert all(b > GATE for b in _feed(0.97, 300, jitter_s=0.05))
    near = _feed(1.015, 120, jitter_s=0.05)  # within the gate, but a 10 s span cannot tell it from 2.5%
    first = next(t for t, b in enumerate(near) if b <= GATE)
    assert first > GATE_SPAN_S + 2 * WINDOW_S

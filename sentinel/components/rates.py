"""Counter histories and their rates: what the NVLink and PCIe signals remember of an error counter.

A history holds the counter's changes (and the reading just before each), bounded; the rate is the
steepest recent rise per second. Pure: readings and times in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence

#: counter changes kept per GPU and counter
RATE_HISTORY = 64

Reading = tuple[float, int]


def record_change(hist: list[Reading], prev: Reading | None, t: float, value: int) -> None:
    """Record a counter change; the reading just before it is kept too, so rates start at the change."""
    if prev is not None and (not hist or hist[-1][0] < prev[0]):
        hist.append(prev)
    hist.append((t, value))
    if len(hist) > RATE_HISTORY:
        del hist[: len(hist) - RATE_HISTORY]


def counter_rate(
    hist: Sequence[Reading], latest: Reading | None, window_s: float, min_span_s: float = 5.0
) -> float:
    """The steepest recent increase per second of a counter: over the window, or since it began rising.

    Spans shorter than ``min_span_s`` count as that long, so one stray error is never a high rate while a
    counter climbing fast is seen within a tick or two.
    """
    if latest is None or not hist:
        return 0.0
    t_now, v_now = latest
    start = t_now - window_s
    best = 0.0
    at_start = hist[0][1]
    for t, v in hist:
        if t <= start:
            at_start = v
            continue
        if v < v_now:
            best = max(best, (v_now - v) / max(t_now - t, min_span_s))
    if at_start < v_now:
        best = max(best, (v_now - at_start) / max(window_s, min_span_s))
    return best

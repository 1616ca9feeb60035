"""Robust statistics for peer comparisons: medians and the median absolute deviation.

One sick GPU or late rank must not move the yardstick it is measured against, so the straggler detector
and the Flight Recorder's lateness compare with medians, not means. Plain Python: the ``fr analyze`` path
imports this and must not pay for :mod:`statistics`.
"""

from __future__ import annotations

from collections.abc import Sequence

#: MAD times this estimates the standard deviation of normally distributed values (robust z = (x - median) /
#: (MAD_SCALE * MAD)).
MAD_SCALE = 1.4826


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (at least one)."""
    return median_of_sorted(sorted(values))


def median_of_sorted(ordered: Sequence[float]) -> float:
    """The median of the already sorted ``ordered`` (at least one value)."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def median_without(ordered: Sequence[float], i: int) -> float:
    """The median of the sorted ``ordered`` without its element at index ``i`` (at least two values; O(1))."""
    m = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < i else ordered[k + 1]

    if m % 2:
        return float(at(m // 2))
    return (at(m // 2 - 1) + at(m // 2)) / 2


def median_mad(values: Sequence[float]) -> tuple[float, float]:
    """The median of ``values`` (at least one) and their median absolute deviation from it."""
    med = median(values)
    return med, median([abs(v - med) for v in values])

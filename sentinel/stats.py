"""Robust statistics for peer comparisons: medians and the median absolute deviation.

One sick GPU or late rank must not move the yardstick it is measured against, so the straggler detector
and the Flight Recorder's lateness compare with medians, not means; and one host must not either, so the
fleet's comparisons weigh each host's values as one vote (:func:`host_median_mad`). Plain Python: the ``fr analyze`` path
imports this and must not pay for :mod:`statistics`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
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


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value where half the weight lies on either side (the mean of the two neighbours at an exact half,
    so equal weights give :func:`median`); at least one value.

    Values of one weight are sorted together and the answer is searched for in each run (a fleet's hosts
    have a few distinct GPU counts, so a few runs): 49,152 values cost about what :func:`median` costs,
    where sorting them as (value, weight) pairs cost six times as much."""
    classes: dict[float, list[float]] = {}
    for value, weight in zip(values, weights, strict=True):
        classes.setdefault(weight, []).append(value)
    if len(classes) == 1:
        return median(values)
    runs = [(weight, sorted(run)) for weight, run in classes.items()]
    half = sum(weight * len(run) for weight, run in runs) / 2.0
    eps = half * 1e-9

    def up_to(x: float) -> float:
        """The weight of the values at most ``x``."""
        return sum(weight * bisect_right(run, x) for weight, run in runs)

    found = math.inf
    for _, run in runs:  # each run's first value with half the weight at or below it; the least of them
        lo, hi = 0, len(run)
        while lo < hi:
            mid = (lo + hi) // 2
            if up_to(run[mid]) >= half - eps:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(run):
            found = min(found, run[lo])
    if abs(up_to(found) - half) <= eps:
        above = [run[i] for _, run in runs if (i := bisect_right(run, found)) < len(run)]
        if above:
            return (found + min(above)) / 2.0
    return found


def host_median_mad(values: Sequence[float], hosts: Sequence[str | None]) -> tuple[float, float, int]:
    """Median and MAD with each host one vote (a value weighted 1 / its host's count of values; a value of
    unknown host counts as a host of its own), and the number of distinct hosts. However many values one host
    reports, with two or more other hosts the median stays within what the others report."""
    counts = Counter(hosts)
    distinct = len(counts) - (None in counts) + counts.get(None, 0)
    if len(set(counts.values())) == 1 and (None not in counts or counts[None] == 1):
        return (*median_mad(values), distinct)  # every host as many values: equal weights
    weights = [1.0 if host is None else 1.0 / counts[host] for host in hosts]
    med = weighted_median(values, weights)
    mad = weighted_median([abs(v - med) for v in values], weights)
    return med, mad, distinct

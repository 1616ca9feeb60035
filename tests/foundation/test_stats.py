"""The robust statistics helper agrees with the standard library on any input."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from sentinel.stats import median, median_mad, median_of_sorted, median_without

values = st.lists(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), min_size=1, max_size=60)


@given(values)
def test_median_is_the_standard_median(xs: list[float]) -> None:
    assert median(xs) == statistics.median(xs)
    assert median_of_sorted(sorted(xs)) == statistics.median(xs)


@given(values.filter(lambda xs: len(xs) >= 2), st.data())
def test_median_without_drops_one_element(xs: list[float], data: st.DataObject) -> None:
    ordered = sorted(xs)
    i = data.draw(st.integers(min_value=0, max_value=len(ordered) - 1))
    assert median_without(ordered, i) == statistics.median(ordered[:i] + ordered[i + 1 :])


@given(values)
def test_mad_is_the_median_distance_from_the_median(xs: list[float]) -> None:
    med, mad = median_mad(xs)
    assert med == statistics.median(xs)
    assert mad == statistics.median([abs(x - med) for x in xs])


def test_one_outlier_moves_neither_median_nor_mad() -> None:
    assert median_mad([10.0, 10.0, 11.0, 9.0, 10.0]) == median_mad([10.0, 10.0, 11.0, 1e6, 10.0])

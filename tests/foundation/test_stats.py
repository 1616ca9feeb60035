"""The robust statistics helper agrees with the standard library on any input."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.stats import (
    host_median_mad,
    median,
    median_mad,
    median_of_sorted,
    median_without,
    weighted_median,
)

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


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_equal_weights_give_the_plain_median(xs: list[float]) -> None:
    assert weighted_median(xs, [1.0] * len(xs)) == pytest.approx(median(xs))


@settings(max_examples=300, deadline=None)
@given(
    honest=st.lists(st.lists(st.floats(1000.0, 2000.0), min_size=1, max_size=8), min_size=2, max_size=10),
    liar=st.lists(st.floats(0.0, 1e5, allow_nan=False), min_size=1, max_size=1024),
)
def test_one_host_cannot_move_the_median_out_of_the_others_range(
    honest: list[list[float]], liar: list[float]
) -> None:
    """However many values one host reports, and whatever they are, with two or more other hosts the
    host-weighted median stays within what the others report."""
    xs = [v for per_host in honest for v in per_host] + liar
    hosts: list[str | None] = [f"h{i}" for i, per_host in enumerate(honest) for _ in per_host]
    hosts += ["liar"] * len(liar)
    med, _, distinct = host_median_mad(xs, hosts)
    assert distinct == len(honest) + 1
    fair = [v for per_host in honest for v in per_host]
    assert min(fair) <= med <= max(fair)


def _by_definition(xs: list[float], ws: list[float]) -> float:
    """The weighted median walked value by value: the first whose running weight reaches half (the mean with
    the next value when it reaches half exactly)."""
    pairs = sorted(zip(xs, ws, strict=True))
    half = sum(ws) / 2
    total = 0.0
    for i, (x, w) in enumerate(pairs):
        total += w
        if total >= half * (1 - 1e-9):
            return (x + pairs[i + 1][0]) / 2 if abs(total - half) <= half * 1e-9 and i + 1 < len(pairs) else x
    raise AssertionError("unreachable")


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1.0, 2.0, 3.0, 1e3]) | st.floats(0, 1e4),
            st.sampled_from([1, 1 / 2, 1 / 3, 1 / 8]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_weighted_median_is_the_weighted_median_by_definition(pairs: list[tuple[float, float]]) -> None:
    xs, ws = [x for x, _ in pairs], [w for _, w in pairs]
    assert weighted_median(xs, ws) == pytest.approx(_by_definition(xs, ws))

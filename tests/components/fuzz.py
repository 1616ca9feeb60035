"""Fuzzing a component's text parser: arbitrary text and text built from the parser's own key words,
never an exception, each call within a time bound (regexes written without nested quantifiers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

BOUND_S = 2.0
#: characters parsers split on, and ones that are not text
PUNCTUATION = [":", "[", "]", "(", ")", " ", ",", "=", "9", "-", "\n", "\r", "\udcff", "\x00"]


def texts(fragments: Sequence[str]) -> st.SearchStrategy[str]:
    """Any text, or text assembled from ``fragments`` (the shapes a backtracking regex loops on)."""
    pieces = st.sampled_from([*fragments, *PUNCTUATION])
    built = st.lists(st.one_of(pieces, st.text(max_size=20)), max_size=60).map("".join)
    return st.one_of(st.text(max_size=400), built)


def parses_within_bound(parse: Callable[[str], Any], text: str) -> None:
    start = time.perf_counter()
    parse(text)
    assert time.perf_counter() - start < BOUND_S

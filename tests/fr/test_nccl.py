"""NCCL-format timing fields, on SYNTHETIC NCCL dumps derived from the real gloo corpus (tests/fr/nccl_synth.py).

``state`` / ``time_discovered_started_ns`` / ``time_discovered_completed_ns`` / ``duration_ms`` are what
gloo lacks: with them a collective started on every rank and completed on none is a network/transport
stall, and the per-rank start times find stragglers.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.loader import discover, load_dump
from sentinel.fr.summary import MIN_TIMED_ENTRIES, starts_polled, summarize
from tests.fr.conftest import corpus_folders, ground_truth
from tests.fr.nccl_synth import nccl_set, poll_starts


def _folder(name: str) -> Path:
    return next(p for p in corpus_folders() if p.name == name)


def test_started_everywhere_completed_nowhere_is_a_transport_stall(tmp_path: Path) -> None:
    src = _folder("healthy_n8")
    out = nccl_set(src / "pickle", tmp_path, ground_truth(src), stall_last=True)
    result = analyze_dir(out, workers=0)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks == []
    assert "network/transport" in result.summary
    assert result.collective is not None and result.collective["pg_desc"] == "default_pg"


def test_same_dumps_without_start_times_stay_inconclusive(tmp_path: Path) -> None:
    src = _folder("healthy_n8")
    out = nccl_set(src / "pickle", tmp_path, ground_truth(src), stall_last=True, started_pending=False)
    # the stalled collective is "scheduled" everywhere: queued, never seen starting on a device
    result = analyze_dir(out, workers=0)
    assert result.verdict == "inconclusive", result.summary
    assert result.culprit_ranks == []


def test_a_missing_rank_is_still_the_culprit_when_the_waiters_started(tmp_path: Path) -> None:
    src = _folder("hang_cascade_n8")
    truth = ground_truth(src)
    result = analyze_dir(nccl_set(src / "pickle", tmp_path, truth), workers=0)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks[0] == truth["culprit_ranks"][0]
    assert result.collective is not None and result.collective["seq"] == truth["collective_seq_id"]


def test_start_lags_and_durations_find_the_straggler(tmp_path: Path) -> None:
    src = _folder("straggler_n8")
    truth = ground_truth(src)
    result = analyze_dir(nccl_set(src / "pickle", tmp_path, truth), workers=0)
    assert result.verdict == "straggler", result.summary
    assert result.culprit_ranks == truth["culprit_ranks"]
    assert any("duration_ms" in f for f in result.findings)
    measured = truth["measured_lag_from_dumps"]["median_ms"]
    assert abs(result.stragglers[0].lag_ms_median - measured) < 0.25 * measured


def test_nccl_pg_config_gives_the_members_of_a_rank_without_dump(tmp_path: Path) -> None:
    src = _folder("size_mismatch_crash_n4")
    truth = ground_truth(src)
    result = analyze_dir(nccl_set(src / "pickle", tmp_path, truth), workers=0)
    assert result.verdict == "crash", result.summary
    assert result.culprit_ranks[0] == 3
    assert result.missing_dumps == [3]


def test_starts_stamped_by_the_watchdog_are_not_read_as_a_straggler(tmp_path: Path) -> None:
    """Each rank's watchdog stamps start and completion in the same pass, at its own phase: rank 5's runs
    10 ms behind the others', so its "starts" trail theirs by 10 ms on nine collectives of ten. Read as
    the device's starts, that was a straggler in a healthy job; the arrivals are the enqueue times."""
    src = _folder("healthy_n8")
    out = nccl_set(src / "pickle", tmp_path, ground_truth(src))
    poll_starts(out, {5: 10.0, **{r: 0.3 * r for r in range(5)}})
    result = analyze_dir(out, workers=0)
    assert result.verdict == "healthy", result.summary
    assert result.stragglers == []


def test_a_straggler_is_found_through_watchdog_stamped_starts(tmp_path: Path) -> None:
    """The same stamping over the straggler set (read as the device's starts it was a hang of rank 3)."""
    src = _folder("straggler_n8")
    truth = ground_truth(src)
    out = nccl_set(src / "pickle", tmp_path, truth)
    poll_starts(out, {r: 7.0 * r for r in range(8)})
    result = analyze_dir(out, workers=0)
    assert result.verdict == "straggler", result.summary
    assert result.culprit_ranks == truth["culprit_ranks"]


def _timed(gap_ns: int, duration_ms: float) -> dict[str, Any]:
    return {
        "time_discovered_started_ns": 10**18,
        "time_discovered_completed_ns": 10**18 + gap_ns,
        "duration_ms": duration_ms,
    }


def test_starts_polled_needs_most_checkable_entries_found_together() -> None:
    device = _timed(2_000_000, 2.0)  # completion a duration after the start: the device's own times
    polled = _timed(4_000, 2.0)  # found together, 4 us apart, for a 2 ms collective
    n = MIN_TIMED_ENTRIES
    assert not starts_polled([device] * (2 * n), coerced=False)
    assert starts_polled([polled] * n, coerced=False)
    assert not starts_polled([polled] * (n - 1), coerced=False)  # too few to judge
    assert not starts_polled([polled] * n + [device] * n, coerced=False)  # half is not most
    assert starts_polled([polled] * (n + 1) + [device] * n, coerced=False)
    untimed = {"time_discovered_started_ns": None, "time_discovered_completed_ns": None, "duration_ms": None}
    assert not starts_polled([untimed] * 50 + [polled] * (n - 1), coerced=False)


_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "time_discovered_started_ns": _ODD,
                    "time_discovered_completed_ns": _ODD,
                    "duration_ms": _ODD,
                }
            ),
            _ODD,
        ),
        max_size=40,
    )
)
def test_starts_polled_reads_any_decoded_value_without_error(entries: list[Any]) -> None:
    assert starts_polled(entries, coerced=False) in (True, False)


def test_watchdog_stamped_starts_give_the_same_summary_read_either_way(tmp_path: Path) -> None:
    """Decoded dicts and msgspec structs (large sets) judge the starts alike and reduce to one summary."""
    src = _folder("healthy_n8")
    out = nccl_set(src / "pickle", tmp_path, ground_truth(src))
    poll_starts(out, {5: 10.0})
    for f in discover(out):
        dump = load_dump(f.path, f.rank)
        assert starts_polled(dump.entries, coerced=False)
        direct, coerced = summarize(dump), summarize(dump, coerce=True)
        assert direct.to_plain() == coerced.to_plain()
        times = [t for g in direct.groups for t in array("q", g.times) if t]
        created = {e["time_created_ns"] for e in dump.entries}
        assert times and set(times) <= created  # every arrival is an enqueue time

"""NCCL-format timing fields, on SYNTHETIC NCCL dumps derived from the real gloo corpus (tests/fr/nccl_synth.py).

``state`` / ``time_discovered_started_ns`` / ``time_discovered_completed_ns`` / ``duration_ms`` are what
gloo lacks: with them a collective started on every rank and completed on none is a network/transport
stall, and the per-rank start times find stragglers.
"""

from __future__ import annotations

from pathlib import Path

from sentinel.fr.dumpset import analyze_dir
from tests.fr.conftest import corpus_folders, ground_truth
from tests.fr.nccl_synth import nccl_set


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

"""``sentinel fr analyze`` on every real dump set of the shared corpus, in every format it ships."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.loader import discover, load_dump
from sentinel.fr.rank_summary import GroupTrack, summary_from_plain
from sentinel.fr.summary import _Inexact, _marshal_pack, _summarize, summarize
from tests.fr.conftest import SCENARIO_VERDICT, corpus_folders, ground_truth
from tests.support import CORPUS, REPO

FOLDERS = sorted(p.name for p in (CORPUS / "flight_recorder").glob("*/ground_truth.json") for p in [p.parent])
FORMATS = ("pickle", "json", "pickle_pgfix")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", FOLDERS)
def test_verdict_culprit_and_collective_match_ground_truth(name: str, fmt: str) -> None:
    folder = next(p for p in corpus_folders() if p.name == name)
    truth = ground_truth(folder)
    result = analyze_dir(folder / fmt, workers=1)
    assert result.verdict == SCENARIO_VERDICT[truth["scenario"]], result.summary
    if truth["culprit_ranks"]:
        assert result.culprit_ranks[: len(truth["culprit_ranks"])] == truth["culprit_ranks"], result.summary
    else:
        assert result.culprit_ranks == []
    if truth["collective_seq_id"] is not None:
        assert result.collective is not None
        assert result.collective["pg_name"] == truth["pg_name"]
        assert result.collective["seq"] == truth["collective_seq_id"]
        assert result.collective["op"] == truth["op"]
    assert result.missing_dumps == sorted(set(range(truth["nranks"])) - set(truth["dumps_present"]))
    assert result.world_size == truth["nranks"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_entries_read_directly_or_through_msgspec_give_the_same_summaries(fmt: str) -> None:
    """Small sets read entries themselves, large ones through msgspec (sentinel.fr.coerce): on every real
    dump, pickle and JSON, whole or its newest entries, the summaries are the same."""
    for folder in corpus_folders():
        for f in discover(folder / fmt):
            for recent in (None, 16):
                dump = load_dump(f.path, f.rank, recent=recent)
                try:  # what PyTorch writes is read without msgspec
                    _summarize(dump, dump.entries, False, _marshal_pack)
                except _Inexact:
                    pytest.fail(f"{f.path}: read through msgspec")
                assert summarize(dump).to_plain() == summarize(dump, coerce=True).to_plain(), f.path


def test_a_summary_travels_from_a_worker_whole() -> None:
    """Workers send each summary as plain data (to_plain) that the parent rebuilds (summary_from_plain):
    every field of every track arrives, in its place."""
    folder = corpus_folders()[0] / "pickle"
    for f in discover(folder):
        s = summarize(load_dump(f.path, f.rank))
        back = summary_from_plain(s.to_plain())
        assert back.to_plain() == s.to_plain()
        for mine, theirs in zip(s.groups, back.groups, strict=True):
            for field in GroupTrack.__slots__:
                assert getattr(theirs, field) == getattr(mine, field), field


def test_straggler_lag_is_close_to_the_measured_one() -> None:
    folder = next(p for p in corpus_folders() if p.name.startswith("straggler"))
    truth = ground_truth(folder)
    result = analyze_dir(folder / "pickle", workers=1)
    assert [s.rank for s in result.stragglers] == truth["culprit_ranks"]
    measured = truth["measured_lag_from_dumps"]["median_ms"]
    assert abs(result.stragglers[0].lag_ms_median - measured) < 0.25 * measured


def test_op_mismatch_reports_kind_and_both_ops() -> None:
    folder = next(p for p in corpus_folders() if p.name.startswith("op_mismatch"))
    truth = ground_truth(folder)
    result = analyze_dir(folder / "json", workers=1)
    assert result.mismatch is not None
    assert result.mismatch["kind"] == "op"
    assert result.mismatch["found"]["op"] == truth["op"]
    assert result.mismatch["expected"]["op"] == truth["expected_op"]


def test_worker_processes_give_the_same_answer_as_in_process() -> None:
    folder = next(p for p in corpus_folders() if p.name.startswith("hang_cascade"))
    assert (
        analyze_dir(folder / "pickle", workers=0).to_json()
        == analyze_dir(folder / "pickle", workers=2).to_json()
    )


def test_cli_json_contract_and_exit_codes() -> None:
    folder = next(p for p in corpus_folders() if p.name.startswith("hang_cascade"))
    proc = subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder / "pickle"), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in (
        "verdict",
        "culprit_ranks",
        "collective",
        "mismatch",
        "missing_dumps",
        "stragglers",
        "findings",
    ):
        assert key in out
    assert set(out["collective"]) >= {"pg_name", "pg_desc", "seq", "op"}
    assert out["culprit_ranks"][0] == 3
    text = subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder / "json")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert text.returncode == 0
    assert text.stdout.splitlines()[0].startswith("hang: rank 3 ")
    # the scenario root holds pickle/, json/ and meta/: several files per rank → unusable, one line
    bad = subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr

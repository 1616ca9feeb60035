"""Dumps written by a real torch==2.13 gloo job (4 CPU ranks) with injected faults, analyzed end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sentinel.fr.dumpset import analyze_dir
from tests.support import need_module

WORLD = 4


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    need_module("torch")
    from tests.fr import gloo_job

    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    for scenario in ("healthy", "hang", "straggler", "op_mismatch"):
        folder = tmp_path_factory.mktemp(scenario)
        out[scenario] = (folder, gloo_job.run(scenario, WORLD, folder, timeout_s=90))
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_healthy_job(jobs: dict[str, tuple[Path, dict[str, Any]]], fmt: str) -> None:
    folder, _ = jobs["healthy"]
    result = analyze_dir(folder / fmt, workers=1)
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_hang_cascade_names_the_rank_that_never_entered(
    jobs: dict[str, tuple[Path, dict[str, Any]]], fmt: str
) -> None:
    folder, expected = jobs["hang"]
    result = analyze_dir(folder / fmt, workers=1)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks[0] == 3
    assert result.collective is not None
    assert (result.collective["pg_name"], result.collective["seq"], result.collective["op"]) == (
        expected["pg_name"],
        expected["seq"],
        expected["op"],
    )


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_straggler_on_demand_dump_is_not_a_hang(
    jobs: dict[str, tuple[Path, dict[str, Any]]], fmt: str
) -> None:
    folder, _ = jobs["straggler"]
    result = analyze_dir(folder / fmt, workers=1)
    assert result.verdict == "straggler", result.summary
    assert result.culprit_ranks == [1]
    assert result.stragglers[0].lag_ms_median > 15


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_op_mismatch(jobs: dict[str, tuple[Path, dict[str, Any]]], fmt: str) -> None:
    folder, expected = jobs["op_mismatch"]
    result = analyze_dir(folder / fmt, workers=1)
    assert result.verdict == "mismatch", result.summary
    assert result.culprit_ranks == [3]
    assert result.mismatch is not None and result.mismatch["kind"] == "op"
    assert result.collective is not None
    assert (result.collective["pg_name"], result.collective["seq"], result.collective["op"]) == (
        expected["pg_name"],
        expected["seq"],
        expected["op"],
    )


@pytest.mark.e2e
def test_the_culprit_and_the_world_size_are_parameters(tmp_path: Path) -> None:
    """The job injects into the rank it is given, in a world of the size it is given (the sweep's knobs),
    and records that itself: the last rank of 6 never enters a world all_reduce, and is named."""
    need_module("torch")
    from tests.fr import gloo_job

    expected = gloo_job.run("hang_world", 6, tmp_path, timeout_s=90, culprit=5)
    assert (expected["culprit"], expected["kind"], expected["op"]) == (5, "hang_world", "all_reduce")
    for fmt in ("pickle", "json"):
        result = analyze_dir(tmp_path / fmt, workers=1)
        assert result.verdict == "hang", result.summary
        assert result.world_size == 6
        assert result.culprit_ranks[:1] == [5]
        assert result.collective is not None
        assert (result.collective["pg_name"], result.collective["seq"]) == (
            expected["pg_name"],
            expected["seq"],
        )

"""Analysis rules on synthetic dumps: failure modes the corpus does not cover."""

from __future__ import annotations

from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.lateness import EXACT_SIGN_TEST_MAX, STRAGGLER_SIGNIFICANCE, _min_late
from sentinel.fr.waitgraph import Wait, find_culprits
from tests.fr.synth import entry, write


def _steps(pg: str, n: int, *, desc: str = "", t0: float = 0.0, lag: float = 0.0) -> list[dict[str, object]]:
    return [entry(pg, s, desc=desc, t_ms=t0 + 10 * s + lag) for s in range(1, n + 1)]


def test_dtype_mismatch_in_completed_history(tmp_path: Path) -> None:
    for r in range(4):
        es = _steps("0", 5, desc="default_pg")
        if r == 2:
            es[2] = entry("0", 3, desc="default_pg", dtype="BFloat16", t_ms=30)
        write(tmp_path, r, es)
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "mismatch"
    assert result.culprit_ranks == [2]
    assert result.mismatch is not None and result.mismatch["kind"] == "dtype"
    assert result.collective is not None and result.collective["seq"] == 3


def test_all_gather_size_mismatch_at_the_stall(tmp_path: Path) -> None:
    for r in range(4):
        es = _steps("0", 3, desc="default_pg")
        size = 16 if r == 1 else 32
        es.append(
            entry("0", 4, "all_gather", desc="default_pg", size=size, out=[[4 * size]], done=False, t_ms=50)
        )
        write(tmp_path, r, es, as_json=True)
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "mismatch"
    assert result.culprit_ranks == [1]
    assert result.mismatch is not None and result.mismatch["kind"] == "size"


def test_missing_dump_that_everyone_waits_for_is_a_crash(tmp_path: Path) -> None:
    for r in (0, 1, 2, 4, 5, 6, 7):  # rank 3 crashed: no dump; rank 7's dump proves world size 8
        es = _steps("0", 4, desc="default_pg")
        es.append(entry("0", 5, desc="default_pg", done=False, t_ms=60))
        write(tmp_path / f"host{r // 4}", r, es)
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "crash"
    assert result.culprit_ranks[0] == 3
    assert result.missing_dumps == [3]
    assert result.collective is not None and result.collective["seq"] == 5


def test_waits_in_other_groups_lead_to_the_root() -> None:
    waits = [
        Wait(rank=0, group="tp", seq=9, op="all_reduce", t_ns=100, waiting_for=frozenset({1})),
        Wait(rank=4, group="dp", seq=20, op="all_gather", t_ns=200, waiting_for=frozenset({0})),
        Wait(rank=5, group="dp2", seq=20, op="all_gather", t_ns=210, waiting_for=frozenset({4})),
    ]
    culprits = find_culprits(waits)
    assert [c.ranks for c in culprits] == [(1,)]
    assert culprits[0].first_wait.group == "tp"
    assert culprits[0].victims == {0, 4, 5}


def test_call_order_deadlock_names_the_cycle() -> None:
    waits = [
        Wait(rank=0, group="a", seq=3, op="all_reduce", t_ns=100, waiting_for=frozenset({1})),
        Wait(rank=1, group="b", seq=7, op="all_reduce", t_ns=90, waiting_for=frozenset({0})),
    ]
    culprits = find_culprits(waits)
    assert len(culprits) == 1 and culprits[0].cycle
    assert culprits[0].ranks == (0, 1)


def test_all_members_inside_one_collective_is_not_blamed_on_a_rank(tmp_path: Path) -> None:
    for r in range(4):
        es = _steps("0", 3, desc="default_pg")
        es.append(entry("0", 4, desc="default_pg", done=False, t_ms=45))
        write(tmp_path, r, es)
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "hang"  # NCCL state "started" on every member: in the network/transport
    assert result.culprit_ranks == []
    assert result.collective is not None and result.collective["seq"] == 4


def test_straggler_in_completed_history(tmp_path: Path) -> None:
    for r in range(8):
        write(tmp_path, r, _steps("0", 40, desc="default_pg", lag=30.0 if r == 6 else 0.01 * r))
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "straggler"
    assert result.culprit_ranks == [6]
    assert 25 < result.stragglers[0].lag_ms_median < 35


def test_healthy_has_no_straggler_under_jitter(tmp_path: Path) -> None:
    for r in range(8):
        write(tmp_path, r, _steps("0", 40, desc="default_pg", lag=0.3 * ((r * 7) % 5)))
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "healthy", result.summary


def _tp_dp_job(folder: Path, slow: dict[int, float], steps: int = 40) -> None:
    """8 ranks in lockstep: a tensor-parallel all_reduce (groups 0-3 and 4-7), then a data-parallel one
    (pairs r, r + 4), each step. A rank arrives 1 ms after its previous collective completed, plus its
    own slowness; a collective completes when its last member arrives (so its other members wait)."""
    clock = dict.fromkeys(range(8), 0.0)
    entries: dict[int, list[dict[str, object]]] = {r: [] for r in range(8)}
    tp = [("1", "tp", [0, 1, 2, 3]), ("2", "tp", [4, 5, 6, 7])]
    dp = [(str(10 + i), "dp", [i, i + 4]) for i in range(4)]
    for step in range(1, steps + 1):
        for name, desc, members in (*tp, *dp):
            arrive = {r: clock[r] + 1.0 + slow.get(r, 0.0) + 0.01 * r for r in members}
            for r in members:
                entries[r].append(entry(name, step, desc=desc, t_ms=arrive[r]))
                clock[r] = max(arrive.values())
    for r, es in entries.items():
        write(folder, r, es)


def test_ranks_that_wait_for_a_straggler_are_not_stragglers(tmp_path: Path) -> None:
    """Rank 5 is slow: its tensor-parallel peers wait for it, then enter their data-parallel collectives
    late — to their dp partners, rank 5's lateness looks like theirs. Where they meet rank 5 they arrive
    on time, its whole lag ahead of it: named as waiting behind it, not as stragglers."""
    _tp_dp_job(tmp_path, {5: 30.0})
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "straggler", result.summary
    assert result.culprit_ranks == [5]
    behind = [f for f in result.findings if "only behind rank 5" in f]
    assert sorted(int(f.split()[1]) for f in behind) == [4, 6, 7]


def test_independent_stragglers_stay_named_whether_or_not_they_meet(tmp_path: Path) -> None:
    _tp_dp_job(tmp_path / "apart", {0: 30.0, 5: 20.0})  # in different groups
    result = analyze_dir(tmp_path / "apart", workers=0)
    assert result.verdict == "straggler", result.summary
    assert result.culprit_ranks == [0, 5]
    # rank 5 is early to its dp partner 1, who waited for rank 0: late on half of all its collectives,
    # on every one of its tp group's, and named with that group's figures
    five = next(s for s in result.to_json()["stragglers"] if s["rank"] == 5)
    assert five["group"] == "2 (tp)"
    assert five["late_fraction"] == 1.0
    assert five["lag_ms_median"] > 19
    _tp_dp_job(tmp_path / "partners", {0: 30.0, 4: 30.0})  # data-parallel partners, equally slow
    result = analyze_dir(tmp_path / "partners", workers=0)
    assert result.verdict == "straggler", result.summary
    assert sorted(result.culprit_ranks) == [0, 4]
    assert not [f for f in result.findings if "only behind" in f]


def test_highest_rank_without_dump_is_found_from_a_short_subgroup(tmp_path: Path) -> None:
    # 8 ranks, tp groups of 4 ("1": 0-3, "2": 4-7); rank 7 crashed and left no dump; world has no all_gather
    for r in range(7):
        tp = "1" if r < 4 else "2"
        es = [entry(tp, s, desc="tp", t_ms=10 * s) for s in range(1, 4)]
        es += [entry("0", s, desc="default_pg", t_ms=10 * s + 5) for s in range(1, 4)]
        es.append(entry(tp, 4, desc="tp", done=tp == "1", t_ms=60))
        write(tmp_path, r, es)
    result = analyze_dir(tmp_path, workers=1)
    assert result.world_size == 8
    assert result.missing_dumps == [7]
    assert result.verdict == "crash"
    assert result.culprit_ranks[0] == 7
    assert result.collective is not None and (result.collective["pg_name"], result.collective["seq"]) == (
        "2",
        4,
    )


def _chance_of_at_least(k: int, n: int) -> Fraction:
    return Fraction(sum(comb(n, i) for i in range(k, n + 1)), 2**n)


@pytest.mark.parametrize("tests", [1, 3])
@pytest.mark.parametrize("n", [*range(1, 70), 200, 640, 1000, EXACT_SIGN_TEST_MAX])
def test_sign_test_threshold_is_the_smallest_count_chance_rarely_reaches(n: int, tests: int) -> None:
    k = _min_late(n, tests)
    alpha = Fraction(str(STRAGGLER_SIGNIFICANCE)) / tests
    assert k > n / 2
    if k <= n:
        assert _chance_of_at_least(k, n) <= alpha
    assert _chance_of_at_least(k - 1, n) > alpha


def test_sign_test_threshold_beyond_the_exact_range_follows_the_binomial_closely() -> None:
    n = EXACT_SIGN_TEST_MAX + 1
    for tests in (1, 3):
        k = _min_late(n, tests)
        alpha = Fraction(str(STRAGGLER_SIGNIFICANCE)) / tests
        # the normal approximation with continuity correction: within a count of the exact threshold
        assert _chance_of_at_least(k + 1, n) <= alpha < _chance_of_at_least(k - 2, n)

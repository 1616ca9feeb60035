"""Rules of the format on dumps recorded from a real torch 2.13 gloo job (tests/data/fr, gzip).

``bcast_size_n8``: rank 2 broadcasts 2,048 elements where its peers expect 1,024; gloo's transport aborts
the receiving ranks 3, 4 and 6 (no dump). ``ondemand_n8``: a healthy job dumped on demand by rank 0 while it
ran (ranks a collective apart). Both recorded with ``python -m tests.fr.gloo_job SCENARIO 8 OUT``.
``ondemand_skew_n4``: the same on-demand dump of 4 ranks (``python -m tests.fr.sweep`` case
gloo-ondemand-n4-healthy, kept with ``--save``): its pickle dumps caught rank 2 right after a world
broadcast, one collective short of its tp peer, while rank 0's dump provably predates a tp all_reduce
its peer completed. ``bcast_size_root_n4``: rank 0, the root, broadcasts 2,048 elements to a world of 4
(sweep case gloo-bcast_size-n4-c0): gloo aborts receivers 1 and 2, and the two dumps left tie.
``straggler_async_partner_n16``: rank 15 of 16 enters every collective 30 ms late, dumped on demand by
rank 0 while the job runs (sweep case gloo-straggler_async-n16-c15): its data-parallel partner, rank 7,
waits for it and so enters its tensor-parallel collectives late too. ``ondemand_in_progress_n32``: a
healthy 32-rank job dumped on demand (sweep case gloo-ondemand-n32-healthy): rank 4 one collective short
of its tp peers, no dump provably stale, the other tp group inside an all_reduce all 16 members entered.
``ondemand_bcast_n24``: a healthy 24-rank job dumped on demand (sweep case gloo-ondemand-n24-healthy): two
ranks a collective short in their tp groups, ranks 3 and 9 still inside a world broadcast the rest had
completed.
Variants are derived the way gloo itself would have written them (a failed collective is retired).
"""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.loader import discover, load_dump
from sentinel.fr.mismatch import _elements, _majority
from sentinel.fr.summary import _sizes
from sentinel.fr.waitgraph import Wait, find_culprits
from tests.fr.conftest import corpus_folders
from tests.support import REPO

DATA = REPO / "tests" / "data" / "fr"


def _recorded(name: str, fmt: str) -> tuple[dict[str, Any], Any]:
    """A recorded set's injection (its expected.json) and the analysis of its ``fmt`` dumps."""
    expected = json.loads((DATA / name / "expected.json").read_text())
    return expected, analyze_dir(DATA / name / fmt, workers=0)


def _rewrite(src: Path, dst: Path, edit: Any) -> None:
    """Copy every dump of ``src`` to ``dst`` as a pickle, after ``edit(rank, dump_dict)``."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in discover(src):
        d = load_dump(f.path)
        top = {"version": d.version, "pg_config": d.pg_config, "pg_status": d.pg_status, "entries": d.entries}
        edit(f.rank, top)
        (dst / f"nccl_trace_rank_{f.rank}").write_bytes(pickle.dumps(top, protocol=2))


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_broadcast_size_mismatch_names_the_sender_not_the_aborted_receivers(fmt: str) -> None:
    expected, result = _recorded("bcast_size_n8", fmt)
    assert result.verdict == "mismatch", result.summary
    assert result.culprit_ranks == [2]
    assert result.mismatch is not None and result.mismatch["kind"] == "size"
    assert result.collective is not None
    assert (result.collective["pg_name"], result.collective["seq"]) == (expected["pg_name"], expected["seq"])
    assert result.missing_dumps == [3, 4, 6]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_size_tie_among_survivors_goes_against_the_larger_tensor_the_aborted_ranks_refused(
    fmt: str,
) -> None:
    """Rank 0 (2,048 elements) and rank 3 (1,024) are all that is left: a one-to-one tie, and the group
    used neither key elsewhere. Ranks 1 and 2 left no dump — gloo aborted them on an oversized message, so
    they held the smaller tensor: rank 0 passed the odd size (the lowest rank no longer wins the tie)."""
    expected, result = _recorded("bcast_size_root_n4", fmt)
    assert result.verdict == "mismatch", result.summary
    assert result.culprit_ranks == [expected["culprit"]] == [0]
    assert result.mismatch is not None and result.mismatch["kind"] == "size"
    assert result.collective is not None
    assert (result.collective["pg_name"], result.collective["seq"]) == (expected["pg_name"], expected["seq"])
    assert result.missing_dumps == [1, 2]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize(
    ("name", "straggler", "others"),
    [
        # 16 ranks; rank 15 sleeps before every collective; its dp partner 7 waits for it in each dp
        # all_gather, then enters its tp collectives as late as it waited: 8 ms late on 54% of 39
        ("straggler_async_partner_n16", 15, [7]),
        # 24 ranks (tp groups of 12, dp pairs); rank 0 sleeps before every collective. Rank 8, in rank 0's
        # tp group, leaves each world broadcast only once rank 0 arrives in it (its peers left before):
        # 5 ms late on 64% of 42
        ("straggler_relay_n24", 0, [8]),
        # 48 gloo ranks on two cores: every collective takes 100-400 ms to return, and eleven ranks of rank
        # 47's tp group come out 5-10 ms late on 60-64% of 42 collectives
        ("straggler_noise_n48", 47, [28, 29, 30, 31, 38, 41, 42, 43, 44, 45, 46]),
    ],
)
def test_a_rank_late_on_a_chance_share_of_its_collectives_is_not_a_straggler(
    fmt: str, name: str, straggler: int, others: list[int]
) -> None:
    """Each of these real sets named more stragglers than the one injected: ranks whose lag median was
    over 5 ms, but late on no more collectives than a rank on time reaches by chance (a sign test: the
    straggler is late on 93-100% of them)."""
    expected, result = _recorded(name, fmt)
    assert result.verdict == "straggler", result.summary
    assert result.culprit_ranks == [expected["culprit"]] == [straggler]
    named = {int(f.split()[1]) for f in result.findings if f.startswith("rank ") and "creates its" in f}
    assert named == {straggler} and not named & set(others)


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_two_rank_job_whose_peer_died_before_dumping_is_a_crash_not_healthy(fmt: str) -> None:
    """Rank 1 all_reduces 512 elements where rank 0 sends 1,024: gloo kills rank 1's process, which leaves
    no dump. gloo writes no pg_config, and rank 0 completed every collective it entered: only its dp
    all_gather's shapes (64 in, 128 out) say the world has a second rank. Read as one rank's world, it
    was "healthy"."""
    expected, result = _recorded("size_crash_n2", fmt)
    assert result.world_size == 2
    assert result.verdict == "crash", result.summary
    assert result.culprit_ranks == [expected["culprit"]] == [1]


def test_a_collective_every_member_entered_bounds_when_the_dumps_were_taken() -> None:
    """No dump predates a collective its peer completed, but group 2's all_reduce #11 was in progress in
    every member's dump, entered by all: they were taken before it completed, soon after rank 4's last
    entry — sooner than rank 4's own pauses between collectives. A running job, not a hang of rank 4."""
    result = analyze_dir(DATA / "ondemand_in_progress_n32" / "pickle", workers=0)
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []
    assert any(f.startswith("rank 4 is one collective short") and "in progress" in f for f in result.findings)


def test_an_in_progress_collective_does_not_vouch_for_a_long_silence(tmp_path: Path) -> None:
    """The same dumps with rank 4's entries moved a second earlier: its peers then waited for it far
    longer than any collective of the in-progress group took, so the bound no longer fits: a hang."""
    shift = 1_000_000_000

    def earlier(rank: int, top: dict[str, Any]) -> None:
        if rank == 4:
            for e in top["entries"]:
                e["time_created_ns"] -= shift

    _rewrite(DATA / "ondemand_in_progress_n32" / "pickle", tmp_path, earlier)
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks == [4]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_collective_some_members_completed_bounds_the_dumps_by_those_still_inside(fmt: str) -> None:
    """A healthy 24-rank job dumped on demand: ranks 14 and 1 (pickle) are each a collective short in
    their tp group, no dump is provably stale, and the only collective in progress is a world broadcast
    that ranks 3 and 9 were still receiving while the other 22, the two "culprits" among them, had
    completed it. Those two were dumped before they completed it: soon after its last arrival, sooner
    than the "culprits"' own pauses. Was a hang of ranks 14 and 1 (in pickle) when only collectives none
    completed, of groups without the culprit, bounded the dumps."""
    expected, result = _recorded("ondemand_bcast_n24", fmt)
    assert expected["kind"] == "ondemand"
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []


def test_a_broadcast_in_progress_does_not_vouch_for_a_long_silence(tmp_path: Path) -> None:
    """The same dumps with the entries of the ranks a collective short moved a second earlier: their
    peers waited for them far longer than the broadcast's receivers ever took, so no bound fits: a hang."""
    shift = 1_000_000_000
    src = DATA / "ondemand_bcast_n24" / "pickle"
    short = analyze_dir(src, workers=0)
    behind = [
        int(f.split()[1]) for f in short.findings if f.startswith("rank ") and "one collective short" in f
    ]
    assert len(behind) >= 1

    def earlier(rank: int, top: dict[str, Any]) -> None:
        if rank in behind:
            for e in top["entries"]:
                e["time_created_ns"] -= shift

    _rewrite(src, tmp_path, earlier)
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "hang", result.summary
    assert set(result.culprit_ranks) == set(behind)


def test_mismatch_outranks_the_abort_when_every_survivor_completed_it(tmp_path: Path) -> None:
    # gloo records the failed broadcast as retired: nobody waits, three ranks left no dump
    def fail_it(rank: int, top: dict[str, Any]) -> None:
        for e in top["entries"]:
            e["retired"] = True
        for status in top["pg_status"].values():
            status["last_completed_collective"] = status["last_enqueued_collective"]

    _rewrite(DATA / "bcast_size_n8" / "pickle", tmp_path, fail_it)
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "mismatch", result.summary
    assert result.culprit_ranks == [2]
    assert any("left no dump" in f for f in result.findings)


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_on_demand_dumps_of_a_running_job_are_not_a_hang(fmt: str) -> None:
    result = analyze_dir(DATA / "ondemand_n8" / fmt, workers=0)
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []
    text = " ".join(result.findings)
    # no self-contradicting evidence: a rank named missing from a collective is never one that entered it
    assert "is missing from" not in text


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_rank_one_short_within_the_skew_the_dumps_prove_is_not_a_hang(fmt: str) -> None:
    """Rank 2 is not provably stale (no peer completed a collective it lacks), but rank 0 is: the dumps
    were taken within 7 ms of rank 2's last entry, less than its own pauses between collectives."""
    expected, result = _recorded("ondemand_skew_n4", fmt)
    assert expected["culprit"] == -1  # what the job injected: nothing
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []
    if fmt == "pickle":  # (the JSON dumps were taken later, the ranks caught up)
        assert any(
            "rank 2 is one collective short" in f and "no stall threshold fits" in f for f in result.findings
        )


def test_a_rank_silent_longer_than_its_pauses_is_still_the_culprit(tmp_path: Path) -> None:
    """The same dumps with rank 2's entries a second earlier (it stopped a second before the others'
    last entries, its pauses unchanged): no skew explains that silence, rank 2 hangs the tp group."""

    def earlier(rank: int, top: dict[str, Any]) -> None:
        if rank == 2:
            for e in top["entries"]:
                e["time_created_ns"] -= 1_000_000_000

    _rewrite(DATA / "ondemand_skew_n4" / "pickle", tmp_path, earlier)
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks == [2]
    assert result.collective is not None and result.collective["pg_desc"] == "tp"


def test_skewed_snapshot_of_rank_0_is_not_blamed(tmp_path: Path) -> None:
    # rank 0's dump is taken a collective earlier than its peers' (the on-demand skew, on rank 0 this time)
    folder = next(p for p in corpus_folders() if p.name == "healthy_n8")

    def earlier(rank: int, top: dict[str, Any]) -> None:
        if rank != 0:
            return
        last = top["entries"].pop()
        pg = str(last["pg_id"])
        top["pg_status"][pg]["last_enqueued_collective"] = last["collective_seq_id"] - 1
        top["pg_status"][pg]["last_completed_collective"] = last["collective_seq_id"] - 1

    def later(rank: int, top: dict[str, Any]) -> None:
        earlier(rank, top)
        if rank == 0:
            return
        e = dict(top["entries"][-1])  # peers moved on into the next barrier
        e.update(collective_seq_id=e["collective_seq_id"] + 1, retired=False)
        e["time_created_ns"] += 1_000_000
        top["entries"].append(e)
        top["pg_status"][str(e["pg_id"])]["last_enqueued_collective"] = e["collective_seq_id"]

    _rewrite(folder / "pickle", tmp_path, later)
    result = analyze_dir(tmp_path, workers=0)
    # the peers completed barrier #139 and moved on into #140: rank 0 must have entered #139 after its dump
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []
    assert any("rank 0's dump predates" in f for f in result.findings)


def test_last_barrier_in_progress_on_one_rank_is_healthy(tmp_path: Path) -> None:
    folder = next(p for p in corpus_folders() if p.name == "healthy_n8")

    def still_in_it(rank: int, top: dict[str, Any]) -> None:
        if rank != 5:
            return
        last = top["entries"][-1]
        last["retired"] = False
        top["pg_status"][str(last["pg_id"])]["last_completed_collective"] = last["collective_seq_id"] - 1

    _rewrite(folder / "pickle", tmp_path, still_in_it)
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []
    assert any("in progress" in f and "rank 5" in f for f in result.findings)


def test_wait_graph_kinds() -> None:
    # ranks 0-3 inside tp #11 (all entered); 4 waits in dp for 0; 5 waits in world for 6, which waits nowhere
    waits = [Wait(r, "tp", 11, "all_reduce", 10 + r, frozenset()) for r in range(4)]
    waits.append(Wait(4, "dp", 11, "all_gather", 20, frozenset({0})))
    waits.append(Wait(5, "world", 21, "all_reduce", 30, frozenset({6})))
    culprits = find_culprits(waits)
    kinds = {c.ranks: c.kind for c in culprits}
    assert kinds == {(0,): "all_in", (1,): "all_in", (2,): "all_in", (3,): "all_in", (6,): "missing"}
    zero = next(c for c in culprits if c.ranks == (0,))
    assert (zero.first_wait.group, zero.first_wait.rank) == ("tp", 0)
    assert zero.victims == {4}
    only_inside = find_culprits(waits[:4])
    assert [c.kind for c in only_inside] == ["all_in"] * 4
    assert [c.ranks for c in only_inside] == [(0,), (1,), (2,), (3,)]


def test_a_cascade_names_the_collective_that_holds_most_ranks_for_the_absent_one() -> None:
    """Rank 3 never enters its tp all_reduce #7 (ranks 0-2 wait there); its dp peer 7 also waits for it in
    the dp all_gather #7 and, on a loaded host, entered that a little earlier. The stall is the tp one."""
    waits = [Wait(r, "tp", 7, "all_reduce", 1_000 + r, frozenset({3})) for r in range(3)]
    waits.append(Wait(7, "dp", 7, "all_gather", 900, frozenset({3})))
    (culprit,) = find_culprits(waits)
    assert culprit.ranks == (3,)
    assert (culprit.first_wait.group, culprit.first_wait.op) == ("tp", "all_reduce")
    assert culprit.victims >= {0, 1, 2, 7}


@given(st.lists(st.lists(st.integers(0, 1 << 20), max_size=4), max_size=6))
def test_a_keys_element_count_is_read_back_from_its_sizes_text(shapes: list[list[int]]) -> None:
    """What the reduction writes for a key's sizes (``_sizes``, inside the key's brackets) reads back as
    the elements of every tensor: a scalar (shape ``[]``) holds one, no tensors none."""
    text = f"[{_sizes(shapes, 'input_sizes')}]"
    assert _elements(text) == sum(math.prod(s) for s in shapes)


def test_a_key_of_unreadable_size_is_never_the_smaller_one_in_a_tie() -> None:
    # a negative dimension passes the int64 check but says nothing of the tensor's size
    unknown, small, large = 1, 2, 3
    sizes = {unknown: f"[{_sizes([[-1]], 'x')}]", small: "[[1024]]", large: "[[2048]]"}
    assert _elements(sizes[unknown]) is None
    fewer = {k: -n for k, text in sizes.items() if (n := _elements(text)) is not None}
    # one rank each, no group history: the smaller readable size wins, whatever the rank order
    for votes in ({0: unknown, 3: small}, {0: small, 3: unknown}):
        expected, odd = _majority(votes, Counter(), fewer)
        assert expected == small and odd == [r for r, k in votes.items() if k == unknown]
    expected, _ = _majority({0: large, 3: unknown}, Counter(), fewer)
    assert expected == large

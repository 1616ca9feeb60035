"""Real gloo jobs whose ranks run different programs per group, with point-to-point ops (tests/data/fr).

Each ``<scenario>_n<ranks>/`` set was recorded with ``python -m tests.fr.topo_job SCENARIO OUT`` (torch
2.13.0 CPU, gloo, ``TORCH_FR_BUFFER_SIZE=2000``, dumped by the job's own watchdog thread): ``pickle/`` and
``json/`` as PyTorch wrote them (gzip), ``meta/`` the job's own program-order log, ``injected.json`` what
the job injected, ``verdict.json`` the expected verdict per format (culprit, kind, evidence claims).

Gloo does not record send/recv, so for p2p hangs the gloo expectation is the honest one (the culprit
among the ranks that never entered, with the caveat); the NCCL-format version — synthesized from the same
run by :mod:`tests.fr.p2p_synth`, with the p2p entries ProcessGroupNCCL writes — must name the one rank.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.fr.analysis import analyze
from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import discover, load_dump, parse_dump
from sentinel.fr.ops import op_name
from sentinel.fr.summary import summarize
from tests.fr.nccl_synth import mark_completed
from tests.fr.p2p_synth import closers_flagged, p2p_nccl_set, status_as_works
from tests.support import REPO, need_module

DATA = REPO / "tests" / "data" / "fr"
SETS = sorted(p.parent.name for p in DATA.glob("*/verdict.json"))


def _verdict(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name / "verdict.json").read_text())
    return data


def _check(result: Any, want: dict[str, Any]) -> None:
    assert result.verdict == want["verdict"], result.summary
    if "culprit_set" in want:
        assert set(result.culprit_ranks) == set(want["culprit_set"]), result.summary
    else:
        assert result.culprit_ranks == want["culprit_ranks"], result.summary
    coll = want.get("collective")
    if coll is None and "collective" in want:
        assert result.collective is None, result.collective
    if coll is not None:
        assert result.collective is not None, result.summary
        for key, value in coll.items():
            assert result.collective.get(key) == value, (key, result.collective)
    text = "\n".join([result.summary, *result.findings])
    for claim in want["claims"]:
        assert claim in text, (claim, text)


def test_every_set_is_listed() -> None:
    assert len(SETS) >= 7
    for name in SETS:
        assert (DATA / name / "injected.json").exists()
        assert _verdict(name)["culprit"] == json.loads((DATA / name / "injected.json").read_text())["culprit"]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("name", SETS)
def test_gloo_dumps_as_pytorch_wrote_them(name: str, fmt: str) -> None:
    want = _verdict(name)
    result = analyze_dir(DATA / name / fmt, workers=0)
    _check(result, want.get(f"gloo_{fmt}", want["gloo"]))  # (a format's dumps may be taken later)
    assert result.world_size == want["nranks"]
    if (
        want["culprit"] >= 0
        and result.verdict != "inconclusive"
        and want["culprit"] not in result.culprit_ranks
    ):
        pytest.fail(f"the injected culprit {want['culprit']} is not named: {result.summary}")


@pytest.mark.parametrize("name", SETS)
def test_nccl_format_with_p2p_entries_names_the_one_culprit(name: str, tmp_path: Path) -> None:
    want = _verdict(name)
    result = analyze_dir(p2p_nccl_set(DATA / name, tmp_path / "nccl"), workers=0)
    _check(result, want["nccl"])
    assert result.culprit_ranks[:1] == ([want["culprit"]] if want["culprit"] >= 0 else [])


@pytest.mark.parametrize("name", SETS)
def test_nccl_status_counting_send_recv_work_too_gives_the_same_verdicts(name: str, tmp_path: Path) -> None:
    """The same NCCL-format dumps with pg_status as ProcessGroupNCCL keeps it (p2p_synth.status_as_works:
    the last work's seq, a send/recv's from the p2p counter): read as collective seqs, a completed recv #8
    marked a pending all_reduce #7 completed. A group with send/recv entries is read from its entries."""
    want = _verdict(name)
    tops = status_as_works(_tops(p2p_nccl_set(DATA / name, tmp_path / "nccl")))
    result = _analyze_tops(tops)
    _check(result, want["nccl"])
    assert result.culprit_ranks[:1] == ([want["culprit"]] if want["culprit"] >= 0 else [])


def test_gloo_status_counts_ops_and_is_mapped_to_collective_seqs() -> None:
    """gloo's pg_status counts send/recv (op_id space); the summary works in collective seqs."""
    dump = load_dump(next(f.path for f in discover(DATA / "mixed_hang_n4" / "pickle") if f.rank == 0))
    world = next(e for e in reversed(dump.entries) if e["process_group"][1] == "default_pg")
    raw = dump.pg_status[str(world["pg_id"])]
    assert int(raw["last_enqueued_collective"]) == world["op_id"] != world["collective_seq_id"]
    track = next(g for g in summarize(dump).groups if g.desc == "default_pg")
    assert track.enq == world["collective_seq_id"]
    assert track.done == world["collective_seq_id"] - (0 if world["retired"] else 1)
    assert track.unrecorded_ops > 0  # the sends it ran between its collectives left no entry


# ---------------------------------------------------------------- op_id gaps mean send/recv only under gloo


def _without_p2p(tops: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The NCCL-format set with its send/recv entries gone (as if they were never there): the op ids keep
    the gaps they leave."""
    for top in tops.values():
        top["entries"] = [
            e for e in top["entries"] if not e.get("is_p2p") and not e["profiling_name"].endswith("coalesced")
        ]
    return tops


def _renamed(tops: dict[int, dict[str, Any]], prefix: str) -> dict[int, dict[str, Any]]:
    for top in tops.values():
        for e in top["entries"]:
            e["profiling_name"] = prefix + e["profiling_name"].split(":", 1)[-1]
    return tops


def _gaps(tops: dict[int, dict[str, Any]]) -> int:
    """op ids skipped between consecutive collectives of one group, over every rank (the old rule's key)."""
    gaps = 0
    for top in tops.values():
        last: dict[str, int] = {}
        for e in top["entries"]:
            name = e["process_group"][0]
            if name in last and e["op_id"] > last[name] + 1:
                gaps += e["op_id"] - last[name] - 1
            last[name] = e["op_id"]
    return gaps


def test_op_id_gaps_in_nccl_dumps_are_judged_by_the_nccl_rules(tmp_path: Path) -> None:
    """ProcessGroupNCCL records every send/recv, so an NCCL-format set whose op ids skip (send/recv entries
    that are not there) is judged by what it holds: every collective completed, nothing pending → healthy.
    Keyed on the gaps (the old rule) it read as gloo's unrecorded send/recv: inconclusive."""
    tops = _without_p2p(_tops(p2p_nccl_set(DATA / "pp_healthy_n4", tmp_path)))
    assert _gaps(tops) > 0
    summaries = [summarize(parse_dump(t, rank=r, source=f"r{r}", is_json=False)) for r, t in tops.items()]
    assert {g.backend for s in summaries for g in s.groups} == {"nccl"}
    assert all(g.unrecorded_ops == 0 for s in summaries for g in s.groups)
    result = analyze(summaries)
    assert result.verdict == "healthy", result.summary


@pytest.mark.parametrize(("name", "culprit"), [("pp_hang_n4", 3), ("mixed_hang_n4", 2)])
def test_the_same_op_ids_read_as_gloo_or_nccl_by_the_backend_the_dumps_name(name: str, culprit: int) -> None:
    """The real gloo dumps, op ids and all, with their entries' backend renamed: under ``gloo:`` the gaps
    are its unrecorded send/recv (the caveat that a culprit may sit in one); under ``nccl:`` the same gaps
    are not p2p (NCCL would have recorded it) and the caveat goes."""
    gloo = _analyze_tops(_tops(DATA / name / "pickle"))
    nccl = _analyze_tops(_renamed(_tops(DATA / name / "pickle"), "nccl:"))
    caveat = "left no entry"
    assert any(caveat in f for f in gloo.findings), gloo.findings
    assert not any(caveat in f for f in nccl.findings), nccl.findings
    assert nccl.verdict == gloo.verdict == "hang"
    assert culprit in nccl.culprit_ranks and nccl.culprit_ranks == gloo.culprit_ranks


def test_a_healthy_pipeline_reads_by_its_backend() -> None:
    """pp_healthy_n4 as gloo wrote it stays inconclusive (gloo's unrecorded send/recv: a pipeline whose
    ranks all wait in one leaves the same dumps); the same entries named ``nccl:`` are healthy."""
    assert _analyze_tops(_tops(DATA / "pp_healthy_n4" / "pickle")).verdict == "inconclusive"
    renamed = _analyze_tops(_renamed(_tops(DATA / "pp_healthy_n4" / "pickle"), "nccl:"))
    assert renamed.verdict == "healthy", renamed.summary


def test_a_group_whose_entries_name_two_backends_counts_no_unrecorded_ops() -> None:
    """``cpu:gloo,cuda:nccl`` groups write entries of both backends under one name, from two op counters:
    their interleaved op ids are no gloo gaps."""
    tops = _tops(DATA / "pp_hang_n4" / "pickle")
    for top in tops.values():
        seen: dict[str, int] = {}
        for e in top["entries"]:
            name = e["process_group"][0]
            seen[name] = seen.get(name, 0) + 1
            if seen[name] % 2:
                e["profiling_name"] = "nccl:" + e["profiling_name"].split(":", 1)[-1]
    for r, top in tops.items():
        tracks = summarize(parse_dump(top, rank=r, source=f"r{r}", is_json=False)).groups
        assert {t.backend for t in tracks} == {"mixed"}
        assert all(t.unrecorded_ops == 0 for t in tracks)


def test_where_a_loop_ended_is_read_only_from_gloo_groups() -> None:
    """pp_only_hang_n4 with one newer completed collective in a group recorded by NCCL (a job with both
    backends): that group's entries say nothing about unrecorded ops, so no "one-off" line comes from it;
    the gloo group's send/recv still make the verdict inconclusive."""
    tops = _tops(DATA / "pp_only_hang_n4" / "pickle")
    for top in tops.values():
        last = dict(top["entries"][-1])
        last.update(
            pg_id=9,
            process_group=("9", "cuda"),
            collective_seq_id=1,
            op_id=1,
            profiling_name="nccl:all_reduce",
            time_created_ns=last["time_created_ns"] + 10_000,
        )
        top["entries"].append(last)
    result = _analyze_tops(tops)
    assert result.verdict == "inconclusive", result.summary
    assert not any("occurs nowhere earlier" in f for f in result.findings), result.findings


_prefix = st.sampled_from(["gloo:", "nccl:", "", "xccl:", "GLOO:", "gloo :", "g" * 17 + ":", ":"])


@st.composite
def _one_group_dump(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    entries = []
    op = 0
    prefixes = []
    for seq in range(1, draw(st.integers(0, 12)) + 1):
        op += draw(st.integers(1, 4))
        prefix = draw(_prefix)
        prefixes.append(prefix)
        entries.append(
            {
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "op_id": op,
                "profiling_name": prefix + draw(st.sampled_from(["all_reduce", "barrier", "all_reduce x"])),
                "time_created_ns": 1_000_000 + seq,
                "input_sizes": [[4]],
                "output_sizes": [[4]],
                "input_dtypes": ["Float"],
                "output_dtypes": ["Float"],
                "retired": True,
                "is_p2p": False,
            }
        )
    return {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries}, prefixes


@settings(max_examples=200, deadline=None)
@given(_one_group_dump())
def test_fuzz_the_backend_is_read_from_the_names_and_only_gloo_counts_gaps(
    drawn: tuple[dict[str, Any], list[str]],
) -> None:
    top, prefixes = drawn
    tracks = summarize(parse_dump(top, rank=0, source="r0", is_json=False)).groups
    if not prefixes:
        assert tracks == []
        return
    (track,) = tracks
    named = {p[:-1] if p[:-1].isalnum() and p[:-1].islower() and len(p) <= 17 else "" for p in prefixes}
    assert track.backend == (named.pop() if len(named) == 1 else "mixed")
    ops = [e["op_id"] for e in top["entries"]]
    if track.backend != "gloo":
        assert track.unrecorded_ops == 0
        assert track.repeat_gap == -1
    else:
        assert track.unrecorded_ops == ops[-1] - ops[0] - (len(ops) - 1)
        kinds = [op_name(e["profiling_name"]) for e in top["entries"]]
        earlier = [j for j in range(len(kinds) - 1) if kinds[j] == kinds[-1]]
        assert track.repeat_gap == (ops[earlier[-1] + 1] - ops[earlier[-1]] - 1 if earlier else -1)


@given(st.text(max_size=40))
def test_fuzz_backend_is_a_short_prefix_of_the_name_or_nothing(name: str) -> None:
    from sentinel.fr.ops import backend

    found = backend(name)
    assert found == "" or (name.startswith(found + ":") and len(found) <= 16 and found.isascii())


# ---------------------------------------------------------------- rules of the format, not of rank numbers


def _tops(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for f in discover(folder):
        d = load_dump(f.path)
        out[f.rank] = {
            "version": d.version,
            "pg_config": d.pg_config,
            "pg_status": d.pg_status,
            "entries": d.entries,
        }
    return out


def _relabel(tops: dict[int, dict[str, Any]], perm: dict[int, int]) -> dict[int, dict[str, Any]]:
    """The same job with its ranks renumbered: members, pg_config and the group-local peers in p2p names."""
    out = {}
    for rank, top in tops.items():
        old_groups = {n: json.loads(c["ranks"]) for n, c in top["pg_config"].items()}
        new_groups = {n: sorted(perm[r] for r in m) for n, m in old_groups.items()}
        entries = []
        for e in top["entries"]:
            e = dict(e)
            name = e["process_group"][0]
            kind, _, arrow = e["profiling_name"].partition(" ")
            if arrow:
                sep = "->" if "->" in arrow else "<-"
                a, b = (int(x) for x in arrow.split(sep))
                old, new = old_groups[name], new_groups[name]
                e["profiling_name"] = f"{kind} {new.index(perm[old[a]])}{sep}{new.index(perm[old[b]])}"
            entries.append(e)
        config = {n: dict(c, ranks=json.dumps(new_groups[n])) for n, c in top["pg_config"].items()}
        out[perm[rank]] = dict(top, pg_config=config, entries=entries)
    return out


def _analyze_tops(tops: dict[int, dict[str, Any]]) -> Any:
    return analyze(
        [
            summarize(parse_dump(top, rank=r, source=f"rank{r}", is_json=False))
            for r, top in sorted(tops.items())
        ]
    )


@pytest.mark.parametrize(
    "name",
    [
        "pp_hang_n4",
        "pp_recv_hang_n4",
        "pp4_hang_n8",
        "pp_group_hang_n4",
        "ring_hang_n4",
        "compute_stall_dp_n4",
    ],
)
@pytest.mark.parametrize("shift", [1, 2, 3])
def test_renumbered_ranks_move_the_verdict_with_them(name: str, shift: int, tmp_path: Path) -> None:
    tops = _tops(p2p_nccl_set(DATA / name, tmp_path))
    n = len(tops)
    perm = {r: (r * (n - 1) + shift) % n for r in range(n)}  # reverses and rotates: rank 0 gets every role
    base, moved = _analyze_tops(tops), _analyze_tops(_relabel(tops, perm))
    assert moved.verdict == base.verdict
    assert moved.culprit_ranks == [perm[r] for r in base.culprit_ranks], moved.summary
    assert moved.collective is not None and base.collective is not None
    assert (moved.collective["op"], moved.collective["pg_desc"]) == (
        base.collective["op"],
        base.collective["pg_desc"],
    )


def test_gloos_unnamed_pg_config_entry_lists_ranks_of_the_job() -> None:
    """early_exit_last_n4: the last rank of a world-only job exited without a dump. No entry, shape or file
    of the survivors names a rank 3; gloo's one pg_config entry, unnamed (no group to attach it to), lists
    ranks [0, 1, 2, 3]: the world is 4 and rank 3 is missing. Without that entry the same dumps show a world
    of 3 whose last all_reduce is merely in progress; a list beyond twice the ranks seen is not believed."""
    tops = _tops(DATA / "early_exit_last_n4" / "pickle")
    assert sorted(tops) == [0, 1, 2]
    assert all(set(t["pg_config"]) == {""} and t["pg_config"][""]["name"] == "" for t in tops.values())
    listed = _analyze_tops(tops)
    assert (listed.verdict, listed.culprit_ranks, listed.world_size, listed.missing_dumps) == (
        "crash",
        [3],
        4,
        [3],
    )
    for t in tops.values():
        t["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
    unlisted = _analyze_tops(tops)
    assert (unlisted.world_size, unlisted.missing_dumps, unlisted.culprit_ranks) == (3, [], [])
    for t in tops.values():
        t["pg_config"] = {"": {"name": "", "desc": "", "ranks": json.dumps(list(range(1000)))}}
    assert _analyze_tops(tops).world_size == 6  # capped at twice the ranks seen (a hostile list)


def test_a_posted_counterpart_clears_the_peer(tmp_path: Path) -> None:
    """Once rank 3 posts the send rank 1 waits for, nobody 'never posted' anything: both sides of every
    pending p2p op are posted and started, so it is a transfer that does not complete (transport)."""
    tops = _tops(p2p_nccl_set(DATA / "pp_hang_n4", tmp_path))
    pending_recv = next(e for e in tops[1]["entries"] if e.get("is_p2p") and not e["retired"])
    send = dict(pending_recv)
    send.update(profiling_name="nccl:send 3->1", time_created_ns=pending_recv["time_created_ns"] + 1000)
    tops[3]["entries"].append(send)
    result = _analyze_tops(tops)
    text = "\n".join([result.summary, *result.findings])
    assert "never posted" not in text, text
    assert result.verdict == "hang" and "transport" in result.summary, result.summary
    assert result.collective is not None and result.collective.get("p2p") is True


def test_a_send_that_does_not_fit_its_recv_is_a_mismatch_of_the_pair(tmp_path: Path) -> None:
    """Rank 3 posts the send rank 1 waits for, with twice the elements rank 1's recv holds: a p2p size
    mismatch (PyTorch's analyzer compares a send's input with its recv's output), both ranks named."""
    tops = _tops(p2p_nccl_set(DATA / "pp_hang_n4", tmp_path))
    pending_recv = next(e for e in tops[1]["entries"] if e.get("is_p2p") and not e["retired"])
    send = dict(pending_recv)
    send.update(profiling_name="nccl:send 3->1", input_sizes=[[128]], output_sizes=[[128]])
    send["time_created_ns"] += 1000
    tops[3]["entries"].append(send)
    result = _analyze_tops(tops)
    assert result.verdict == "mismatch", result.summary
    assert result.culprit_ranks == [3, 1]
    assert (
        result.mismatch is not None and result.mismatch["kind"] == "size" and result.mismatch["p2p"] is True
    )
    assert result.collective is not None and result.collective["p2p"] is True
    assert "sends [[128]] to rank 1" in result.summary and "[[64]]" in result.summary


def test_a_wrapped_log_without_the_anchor_falls_back_to_pending_ops(tmp_path: Path) -> None:
    """Without collectives (a p2p-only group, or buffers that hold none), pending ops are matched by count."""
    tops = _tops(p2p_nccl_set(DATA / "pp_hang_n4", tmp_path))
    for top in tops.values():
        top["entries"] = [e for e in top["entries"] if e.get("is_p2p")]
        top["pg_status"] = {}
    result = _analyze_tops(tops)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks == [3], result.summary


# ---------------------------------------------------------------- fuzz: p2p entries of any shape

_op_id = st.one_of(
    st.integers(-1, 60), st.just(1 << 70), st.just(-(1 << 63)), st.text("0123456789", max_size=3)
)
_peer = st.one_of(st.integers(-2, 6), st.just(1 << 40), st.text("0123456789-<>x ", max_size=6))


@st.composite
def _p2p_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    world = draw(st.integers(1, 5))
    dumps = []
    for _ in range(world):
        entries: list[dict[str, Any]] = []
        t = 1_000_000
        coll = p2p = 0
        for _ in range(draw(st.integers(0, 14))):
            t += draw(st.integers(0, 5_000))
            kind = draw(st.sampled_from(["coll", "send", "recv", "coalesced", "odd"]))
            e: dict[str, Any] = {
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "time_created_ns": t,
                "input_sizes": [[4]],
                "output_sizes": [[4]],
                "input_dtypes": ["Float"],
                "output_dtypes": ["Float"],
                "retired": draw(st.booleans()),
                "state": draw(st.sampled_from(["scheduled", "started", "completed"])),
                "op_id": draw(_op_id),
            }
            if kind == "coll":
                coll += 1
                e.update(
                    profiling_name="nccl:all_reduce", collective_seq_id=coll, p2p_seq_id=p2p, is_p2p=False
                )
            else:
                p2p += draw(st.integers(0, 1))
                a, b = draw(_peer), draw(_peer)
                name = {
                    "send": f"nccl:send {a}->{b}",
                    "recv": f"nccl:recv {a}<-{b}",
                    "coalesced": "nccl:coalesced",
                    "odd": f"nccl:send {a}",
                }[kind]
                e.update(
                    profiling_name=name, collective_seq_id=coll, p2p_seq_id=p2p, is_p2p=draw(st.booleans())
                )
            entries.append(e)
        members = draw(st.sampled_from([list(range(world)), [], list(range(world + 2)), "[0, x]"]))
        config = {
            "0": {
                "name": "0",
                "desc": "default_pg",
                "ranks": json.dumps(members) if isinstance(members, list) else members,
            }
        }
        ops = [e["op_id"] for e in entries if type(e["op_id"]) is int]
        status = {
            "0": {
                # sometimes the newest op id (gloo's op-counting status), sometimes the collective count
                "last_enqueued_collective": draw(st.sampled_from([coll, *ops[-1:]])),
                "last_started_collective": -1,
                "last_completed_collective": draw(st.integers(-1, coll)),
            }
        }
        dumps.append({"version": "2.10", "pg_config": config, "pg_status": status, "entries": entries})
    return dumps


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_p2p_sets())
def test_fuzz_p2p_entries_give_an_analysis_with_consistent_evidence(dumps: list[dict[str, Any]]) -> None:
    try:
        summaries = [
            summarize(parse_dump(top, rank=r, source=f"rank{r}", is_json=False))
            for r, top in enumerate(dumps)
        ]
    except FrFormatError as exc:
        assert "\n" not in str(exc)
        return
    result = analyze(summaries)
    json.dumps(result.to_json())
    assert all(0 <= r < max(result.world_size, 1) for r in result.culprit_ranks)
    if result.verdict in ("hang", "crash"):
        assert result.culprit_ranks or result.collective is not None, result.summary


def test_fuzz_sets_through_pickle_files(tmp_path: Path) -> None:
    """The p2p fields travel through a real pickle file unchanged (the loader's path, not only parse_dump)."""
    tops = _tops(p2p_nccl_set(DATA / "ring_hang_n4", tmp_path / "a"))
    out = tmp_path / "b"
    out.mkdir()
    for r, top in tops.items():
        (out / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(top, protocol=2))
    assert analyze_dir(out, workers=1).to_json() == _analyze_tops(tops).to_json()


# ---------------------------------------------------------------- the recorder itself, with real torch


@pytest.mark.e2e
@pytest.mark.parametrize("scenario", ["pp_hang"])
def test_a_fresh_real_run_gives_the_recorded_verdicts(scenario: str, tmp_path: Path) -> None:
    need_module("torch")
    from tests.fr import topo_job

    injected = topo_job.run(scenario, tmp_path, timeout_s=90)
    name = f"{scenario}_n{topo_job.WORLD[scenario]}"
    want = _verdict(name)
    assert injected["culprit"] == want["culprit"]
    _check(analyze_dir(tmp_path / "pickle", workers=0), want["gloo"])
    _check(analyze_dir(p2p_nccl_set(tmp_path, tmp_path / "nccl"), workers=0), want["nccl"])


# ---------------------------------------------------------------- live heads of a gloo job that runs p2p


def _json_dump(name: str, rank: int) -> dict[str, Any]:
    import gzip

    data: dict[str, Any] = json.loads(
        gzip.decompress((DATA / name / "json" / f"nccl_trace_rank_{rank}.json.gz").read_bytes())
    )
    return data


def test_live_heads_speak_collective_seqs_under_gloo_p2p() -> None:
    """The probe's heads of a gloo rank that runs p2p: gloo's pg_status counts ops; the heads must say
    which collective the rank last entered, or the stuck detector counts the idle culprit as 'entered'."""
    from sentinel.fr.reduce import reduce_snapshot

    snap = _json_dump("mixed_hang_n4", 2)  # rank 2 never entered its tp all_reduce #8
    ops: dict[int, tuple[int, int]] = {}
    known: dict[int, tuple[str, str]] = {}
    full = reduce_snapshot(snap, rank=2, now=2e9, known_groups=known, op_map=ops)
    world = next(pg for pg in full.pgs if pg.pg_desc == "default_pg")
    newest = max(e["collective_seq_id"] for e in snap["entries"] if e["process_group"][1] == "default_pg")
    raw = snap["pg_status"][str(snap["entries"][-1]["pg_id"])]
    assert int(raw["last_enqueued_collective"]) > newest  # the raw counter is in op space
    assert world.last_enqueued_seq == newest
    tp = next(pg for pg in full.pgs if pg.pg_desc == "tp")
    assert tp.last_enqueued_seq == 7  # (tp #8 is the collective it never entered)
    # status-only snapshots (the probe's steady ticks) are mapped with what the full one learned
    light = reduce_snapshot(
        {"pg_status": snap["pg_status"], "entries": []}, rank=2, now=2e9, known_groups=known, op_map=ops
    )
    assert [(p.pg_name, p.last_enqueued_seq, p.last_completed_seq) for p in light.pgs] == [
        (p.pg_name, p.last_enqueued_seq, p.last_completed_seq) for p in full.pgs
    ]
    # once the counter moves past the mapped collective, the heads say "at least one further"
    pg_id = next(k for k, v in known.items() if v[1] == "default_pg")
    moved = {k: dict(v) for k, v in snap["pg_status"].items()}
    op = ops[pg_id][0]
    moved[str(pg_id)].update(last_enqueued_collective=str(op + 4), last_completed_collective=str(op + 4))
    later = reduce_snapshot(
        {"pg_status": moved, "entries": []}, rank=2, now=2e9, known_groups=known, op_map=ops
    )
    world_later = next(pg for pg in later.pgs if pg.pg_desc == "default_pg")
    assert world_later.last_enqueued_seq == world_later.last_completed_seq == newest + 1


def test_probe_maps_a_moved_gloo_counter_once_it_stands_still() -> None:
    from sentinel.probe import Probe

    snap = _json_dump("mixed_hang_n4", 2)
    probe = Probe(1.0, "/nonexistent/probe.sock")
    from sentinel.fr.reduce import reduce_snapshot

    reduce_snapshot(snap, rank=2, now=0.0, known_groups=probe._known_groups, op_map=probe._op_map)
    status = {k: dict(v) for k, v in snap["pg_status"].items()}
    assert probe._needs_full(status, 100.0) is False  # the counters stand where the full dump mapped them
    pg_id = next(k for k, v in probe._known_groups.items() if v[1] == "default_pg")
    op = probe._op_map[pg_id][0]
    status[str(pg_id)].update(last_enqueued_collective=str(op + 3), last_completed_collective=str(op + 3))
    assert probe._needs_full(status, 101.0) is False  # moved: a running job's counters move all the time
    assert probe._needs_full(status, 101.5) is False
    assert probe._needs_full(status, 102.0) is True  # stood still for an interval: map it with one dump
    assert probe._needs_full(status, 103.0) is False  # once per position


def test_program_order_tells_two_runs_of_one_collective_in_a_step_apart(tmp_path: Path) -> None:
    """A step runs tp all_reduce, world all_reduce, dp all_gather, world all_reduce (the same size twice).
    Rank 2 stops after the *second* world all_reduce of step 4: its next op is tp #5 (rank 3 waits there),
    not the world all_reduce #9 that ranks 0 and 1 entered — earlier, and holding more ranks. Only the ops
    before its last one say which world all_reduce it just ran."""
    from tests.fr.synth import entry, write

    tp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    for rank in range(4):
        es = []
        for step in range(1, 5):
            base = step * 100.0
            es.append(entry(tp[rank], step, desc="tp", t_ms=base))
            es.append(entry("0", 2 * step - 1, desc="default_pg", size=1024, t_ms=base + 10))
            es.append(entry(dp[rank], step, "all_gather", desc="dp", size=32, out=[[64]], t_ms=base + 20))
            es.append(entry("0", 2 * step, desc="default_pg", size=1024, t_ms=base + 30))
        if rank in (0, 1):
            es.append(entry(tp[rank], 5, desc="tp", t_ms=500))
            es.append(entry("0", 9, desc="default_pg", size=1024, done=False, t_ms=501))
        elif rank == 3:
            es.append(entry(tp[rank], 5, desc="tp", done=False, t_ms=509))  # a slow host: later than 0 and 1
        write(tmp_path, rank, es)
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks == [2], result.summary
    assert result.collective == {"pg_name": "2", "pg_desc": "tp", "seq": 5, "op": "all_reduce"}, (
        result.summary
    )
    assert any(
        "rank 2's own program order" in f and "all_reduce #5 of group 2 (tp)" in f for f in result.findings
    )


def test_a_culprit_without_a_dump_takes_its_next_op_from_a_rank_running_the_same_groups(
    tmp_path: Path,
) -> None:
    """compute_stall_dp without rank 2's dump (it crashed after its tp all_reduce): rank 0 waits for it in
    dp #8, ranks 1 and 3 in world #8 (more ranks, and — on hosts whose clocks run a few ms behind — the
    earlier wait). Rank 0 runs the same groups and ran dp #8 first."""
    tops = _tops(DATA / "compute_stall_dp_n4" / "pickle")
    del tops[2]
    dp_wait = next(e for e in tops[0]["entries"] if not e["retired"])
    for r in (1, 3):
        for e in tops[r]["entries"]:
            e["time_created_ns"] -= 20_000_000  # their clocks: 20 ms behind rank 0's
        assert (
            next(e for e in tops[r]["entries"] if not e["retired"])["time_created_ns"]
            < dp_wait["time_created_ns"]
        )
    result = _analyze_tops(tops)
    assert result.verdict == "crash", result.summary
    assert result.culprit_ranks == [2], result.summary
    assert result.collective == {"pg_name": "3", "pg_desc": "dp", "seq": 8, "op": "all_gather"}, (
        result.summary
    )
    assert any("rank 2 left no dump; rank 0, which runs the same groups" in f for f in result.findings)


# ---------------------------------------------------------------- live heads of a job blocked in send/recv only


def _live_stuck(
    tops: dict[int, dict[str, Any]], ages: list[float], world: int = 0
) -> list[tuple[int | None, str, str]]:
    """Every rank's probe heads (``reduce_snapshot`` of its dump, as its probe would have taken it that
    long after the newest entry) fed through the aggregator's engine on a virtual clock; the stuck
    verdicts open at the end."""
    import msgspec

    from sentinel.aggregator.engine import Engine
    from sentinel.fr.reduce import reduce_snapshot
    from sentinel.wire import Batch
    from tests.aggregator.helpers import hello, sample

    engine = Engine()
    n = world or len(tops)
    newest = max(e["time_created_ns"] for top in tops.values() for e in top["entries"]) / 1e9
    host = engine.hello(hello("h0", n), newest)
    known: dict[int, dict[int, tuple[str, str]]] = {r: {} for r in tops}
    maps: dict[int, dict[int, tuple[int, int]]] = {r: {} for r in tops}
    for i, age in enumerate(ages):
        t = newest + age  # the probe's and the aggregator's clock (one host: no skew)
        heads = [
            msgspec.structs.replace(
                reduce_snapshot(
                    top,
                    rank=r,
                    now=newest + age,
                    known_groups=known[r],
                    op_map=maps[r],
                    job_id="pp",
                    world_size=n,
                ),
                gpu=r,
            )
            for r, top in sorted(tops.items())
        ]
        batch = Batch(seq=i, t=t, samples=[sample(g, t) for g in range(n)], heads=heads)
        engine.ingest(host, batch, t)
        engine.tick(t)
    return sorted(
        (v.rank, v.reason, " ".join(v.evidence)) for v in engine.book.open.values() if v.kind == "stuck"
    )


def test_live_heads_of_a_pipeline_blocked_only_in_send_recv_name_the_stage_that_never_sent(
    tmp_path: Path,
) -> None:
    """pp_only_hang_n4 (4 stages, rank 2 never forwards): ranks 0, 1 and 3 each block in a recv, none in a
    collective. The NCCL-format heads carry those recvs: the live verdict names rank 2, as the dumps do."""
    tops = _tops(p2p_nccl_set(DATA / "pp_only_hang_n4", tmp_path))
    found = _live_stuck(tops, [0.5 + 2.0 * i for i in range(6)])
    assert [(r, why) for r, why, _ in found] == [(2, "not_entered_collective")], found
    assert "rank 2 never posted the send that rank" in found[0][2]
    assert "are blocked in send/recv and none in a stalled collective" in found[0][2]


@pytest.mark.parametrize("name", SETS)
def test_live_heads_of_every_recorded_set_name_the_injected_culprit(name: str, tmp_path: Path) -> None:
    """Every set's NCCL-format dumps read as the probe's heads (a snapshot standing still for 10 s, on a
    virtual clock): the live stuck detector names the injected culprit alone — a missing collective, a
    recv whose send was never posted, a pipeline blocked only in send/recv, a rank that left — and nothing
    for the healthy runs (their transfers in flight have both sides posted: no verdict before
    unexplained_wait_s)."""
    want = _verdict(name)
    tops = _tops(p2p_nccl_set(DATA / name, tmp_path))
    found = _live_stuck(tops, [0.5 + 2.0 * i for i in range(6)], world=want["nranks"])
    assert [r for r, _, _ in found] == ([want["culprit"]] if want["culprit"] >= 0 else []), found


@pytest.mark.parametrize(("name", "caveat"), [("pp_hang_n4", True), ("subgroup_hang_n6", False)])
def test_live_gloo_culprit_sets_say_a_culprit_may_sit_in_an_unseen_send_recv(name: str, caveat: bool) -> None:
    """Live heads of the gloo dumps: pp_hang_n4 names ranks 1 and 3 (rank 1 is blocked in a recv from 3
    that gloo never shows), as the dump analysis does, and says so; a lone culprit gets no such line."""
    want = _verdict(name)
    found = _live_stuck(
        _tops(DATA / name / "pickle"), [0.5 + 2.0 * i for i in range(6)], world=want["nranks"]
    )
    ranks = [r for r, _, _ in found]
    assert None not in ranks and sorted(r for r in ranks if r is not None) == sorted(
        want["gloo"].get("culprit_set", want["gloo"].get("culprit_ranks", []))
    )
    line = "one of these culprits may be blocked in a send/recv to another"
    assert all((line in evidence) == caveat for _, _, evidence in found), found


def test_live_heads_of_the_same_gloo_job_carry_no_send_recv_and_give_no_verdict() -> None:
    """The same job as gloo wrote it: gloo records no send/recv, so its heads hold nothing in flight
    and every rank's counters stand still, exactly as while ranks compute. No live verdict (documented);
    the dump analysis of these dumps is inconclusive for the same reason."""
    tops = _tops(DATA / "pp_only_hang_n4" / "pickle")
    assert _live_stuck(tops, [0.5 + 2.0 * i for i in range(6)]) == []


# ---------------------------------------------------------------- coalesced batches as ProcessGroupNCCL writes them


def _batched_upto(tmp_path: Path, last: int) -> dict[int, dict[str, Any]]:
    """ring_hang_n4 in NCCL format cut after collective ``last`` on every rank (each step: one
    ``batch_isend_irecv`` of a send and a recv, then an all_reduce): a job where every op up to there
    completed. The batches' member ops read as p2p_synth writes them — scheduled, not retired, no times —
    and each closing ``nccl:coalesced`` entry completed and retired."""
    tops = _tops(p2p_nccl_set(DATA / "ring_hang_n4", tmp_path))
    for top in tops.values():
        top["entries"] = [
            e
            for e in top["entries"]
            if (e["p2p_seq_id"] <= last if e.get("is_p2p") else e["collective_seq_id"] <= last)
        ]
        for status in top["pg_status"].values():
            status.update(
                last_enqueued_collective=last, last_started_collective=last, last_completed_collective=last
            )
    return tops


def test_a_healthy_job_of_coalesced_batches_reads_healthy(tmp_path: Path) -> None:
    """Every member op of a completed batch stays 'scheduled' and unretired in a real dump (no work of its
    own); its nccl:coalesced entry speaks for it. Read per op, this job was blocked in send/recv."""
    tops = _batched_upto(tmp_path, 7)
    members = [
        e for top in tops.values() for e in top["entries"] if e["profiling_name"].startswith("nccl:send")
    ]
    assert members and all(e["state"] == "scheduled" and e["retired"] is False for e in members)
    result = _analyze_tops(tops)
    assert result.verdict == "healthy", result.summary
    assert result.culprit_ranks == []
    for top in tops.values():  # the msgspec reading agrees with the direct one
        dump = parse_dump(top, rank=0, source="r", is_json=False)
        assert summarize(dump).to_plain() == summarize(dump, coerce=True).to_plain()


@pytest.mark.parametrize("culprit", [0, 2, 3])
def test_a_rank_that_never_posts_its_batch_is_named(culprit: int, tmp_path: Path) -> None:
    """The same job where one rank never posts batch #7: its neighbours' batches started and never
    completed (the closing entry says so for its members), so the rank that posted nothing is the culprit.
    Each entry is cut by its own counter (a send/recv or closer by its p2p_seq_id, a collective by its
    collective_seq_id): the culprit's list ends at all_reduce #6, the others' at their open batch #7."""
    tops = _never_posts_batch(_batched_upto(tmp_path, 7), culprit)
    for rank, top in tops.items():
        if rank == culprit:
            last = top["entries"][-1]
            assert (last["profiling_name"], last["collective_seq_id"]) == ("nccl:all_reduce", 6)
        else:
            assert [e["profiling_name"].split(" ")[0] for e in top["entries"][-3:]] == [
                "nccl:send",
                "nccl:recv",
                "nccl:coalesced",
            ]
    result = _analyze_tops(tops)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks[:1] == [culprit], result.summary


def _counter(e: dict[str, Any]) -> int:
    """An entry's own counter in ring_hang_n4: an all_reduce's collective_seq_id, else its p2p_seq_id."""
    return int(e["collective_seq_id"] if e["profiling_name"] == "nccl:all_reduce" else e["p2p_seq_id"])


def _never_posts_batch(tops: dict[int, dict[str, Any]], culprit: int) -> dict[int, dict[str, Any]]:
    """``tops`` (ring_hang_n4 in NCCL format, batches up to #7) where ``culprit`` never posts batch #7: each
    entry cut by its own counter (a send/recv or closer by its p2p_seq_id, known by name whatever its is_p2p
    says; an all_reduce by its collective_seq_id), so the culprit's list ends at all_reduce #6 and the
    others' batch #7 stays open (its closer started, never completed)."""
    for rank, top in tops.items():
        batch = [
            dict(e) for e in top["entries"] if e["profiling_name"] != "nccl:all_reduce" and _counter(e) == 7
        ]
        entries = [e for e in top["entries"] if _counter(e) < 7]
        if rank != culprit:
            batch[-1].update(
                retired=False, state="started", time_discovered_completed_ns=None, duration_ms=None
            )
            entries += batch
        top["entries"] = entries
        for status in top["pg_status"].values():
            status.update(last_enqueued_collective=6, last_started_collective=6, last_completed_collective=6)
    return tops


def _shift(entries: list[dict[str, Any]], delta_ns: int) -> None:
    for e in entries:
        for k in ("time_created_ns", "time_discovered_started_ns"):
            if e.get(k):
                e[k] += delta_ns


@pytest.mark.parametrize("first_waiter", [0, 2])
@pytest.mark.parametrize("culprit_sends_first", [True, False])
def test_the_op_a_never_posted_batch_is_named_by_comes_from_the_culprits_program_order(
    first_waiter: int, culprit_sends_first: bool, tmp_path: Path
) -> None:
    """Rank 1 never posts batch #7: rank 0 waits in its send to 1, rank 2 in its recv from 1, one group and
    one p2p seq each (equally held). Which of them posted first is timing; the verdict must not follow it.
    It follows rank 1's own program order (docs: "The op a culprit never ran comes from its own program
    order"): its batches post the send to 2 before the recv from 0 (as topo_job's ring does), so it names
    the send rank 2 waits for; the same job with rank 1's batches in the other order names the recv rank 0
    waits for. Either way, whichever victim posted first."""
    tops = _never_posts_batch(_batched_upto(tmp_path, 7), culprit=1)
    later = 2 if first_waiter == 0 else 0
    _shift([e for e in tops[later]["entries"] if e.get("is_p2p") and e["p2p_seq_id"] == 7], 10**9)
    if not culprit_sends_first:  # rank 1 posts each batch's recv first: swap its members, times and places
        entries = tops[1]["entries"]
        for i, e in enumerate(entries[:-1]):
            nxt = entries[i + 1]
            if e["profiling_name"].startswith("nccl:send") and nxt["profiling_name"].startswith("nccl:recv"):
                e["time_created_ns"], nxt["time_created_ns"] = nxt["time_created_ns"], e["time_created_ns"]
                entries[i], entries[i + 1] = nxt, e
    result = _analyze_tops(tops)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks == [1], result.summary
    want = ("recv", 2) if culprit_sends_first else ("send", 0)
    assert result.collective is not None
    assert (result.collective["op"], result.collective["p2p"]) == (want[0], True), result.collective
    assert f"that rank {want[1]} waits for" in result.summary, result.summary
    assert any("own program order" in f for f in result.findings), result.findings


@pytest.mark.parametrize("flag", [False, None])
def test_a_closing_entry_is_read_by_its_place_whatever_its_is_p2p_says(
    flag: bool | None, tmp_path: Path
) -> None:
    """torch 2.5 records a send/recv batch's nccl:coalesced entry with is_p2p False (initWork's
    isP2POp(COALESCED)), and a dump may carry no is_p2p at all: the closer still follows its batch's ops
    with their p2p_seq_id. Read as a collective (what its flag alone says), the healthy job was blocked in
    every batch (inconclusive) and a batch never posted was not named; by its place, as in the 2.10 layout.
    The live reduction reads it the same way: the rank that never posts is named from the heads too."""
    healthy = closers_flagged(_batched_upto(tmp_path / "ok", 7), flag)
    result = _analyze_tops(healthy)
    assert result.verdict == "healthy", result.summary
    for top in healthy.values():  # the msgspec reading agrees with the direct one
        dump = parse_dump(top, rank=0, source="r", is_json=False)
        assert summarize(dump).to_plain() == summarize(dump, coerce=True).to_plain()
    culprit = 2
    tops = _never_posts_batch(closers_flagged(_batched_upto(tmp_path / "hang", 7), flag), culprit)
    result = _analyze_tops(tops)
    assert result.verdict == "hang", result.summary
    assert result.culprit_ranks[:1] == [culprit], result.summary
    found = _live_stuck(tops, [0.5 + 2.0 * i for i in range(6)])
    assert [r for r, _, _ in found] == [culprit], found


@pytest.mark.parametrize("flag", [True, False, None])
@pytest.mark.parametrize("done", ["every", "last"])
def test_a_closer_behind_a_member_that_completed_on_its_own_still_closes_its_batch(
    flag: bool | None, done: str, tmp_path: Path
) -> None:
    """ProcessGroupNCCL::pointToPoint records a batch's ops with no work of their own (they never
    complete); an op that completed had one: it is not part of what the closer speaks for (nothing to
    settle), but the ``nccl:coalesced`` entry right behind it, same group and ``p2p_seq_id``, is still
    its batch's work, not a collective (sentinel.fr.ops.closes_p2p_batch). Known by the last *pending*
    send/recv alone, a closer that says ``is_p2p`` False (torch 2.5) or nothing, behind no pending member
    (``done`` every: the send and the recv of rank 0's batch #6 completed), was folded into all_reduce #5
    before it: "rank 0 called ? where the others call all_reduce", a false mismatch in a healthy job.
    With only the last member completed (``done`` last) the closer still settles the pending send."""
    tops = closers_flagged(_batched_upto(tmp_path / "done", 7), flag)
    unchanged = closers_flagged(_batched_upto(tmp_path / "ok", 7), flag)
    entries = tops[0]["entries"]
    closer = next(
        i for i, e in enumerate(entries) if e["profiling_name"] == "nccl:coalesced" and e["p2p_seq_id"] == 6
    )
    members = [
        i
        for i in range(closer)
        if op_name(entries[i]["profiling_name"]) in ("send", "recv") and entries[i]["p2p_seq_id"] == 6
    ]
    assert members == [closer - 2, closer - 1], "a send and a recv right before their closer"
    for i in members if done == "every" else members[-1:]:
        mark_completed(entries[i])
    result = _analyze_tops(tops)
    assert (result.verdict, result.mismatch) == ("healthy", None), result.summary
    dump = parse_dump(tops[0], rank=0, source="r", is_json=False)
    (track,) = summarize(dump).groups
    (as_recorded,) = summarize(parse_dump(unchanged[0], rank=0, source="r", is_json=False)).groups
    assert track.pending == [] and (track.keys, track.times) == (as_recorded.keys, as_recorded.times)
    assert summarize(dump).to_plain() == summarize(dump, coerce=True).to_plain()


def test_a_batch_of_one_is_written_as_nccl_writes_it_and_a_lone_op_as_its_own_work(tmp_path: Path) -> None:
    """mixed_hang_n4's ranks 1-3 post one irecv per batch_isend_irecv call: on NCCL a batch, so each recv is
    a member (scheduled, unretired, no times) followed by its nccl:coalesced entry (same p2p_seq_id). The
    pipeline's lone isend/irecv are works of their own: no closing entry, their own state."""
    mixed = _tops(p2p_nccl_set(DATA / "mixed_hang_n4", tmp_path / "mixed"))
    for rank in (1, 2, 3):
        entries = mixed[rank]["entries"]
        recvs = [i for i, e in enumerate(entries) if e["profiling_name"].startswith("nccl:recv")]
        assert recvs
        for i in recvs:
            member, closer = entries[i], entries[i + 1]
            assert (member["state"], member["retired"], member["time_discovered_started_ns"]) == (
                "scheduled",
                False,
                None,
            )
            assert closer["profiling_name"] == "nccl:coalesced"
            assert closer["p2p_seq_id"] == member["p2p_seq_id"]
    pipeline = _tops(p2p_nccl_set(DATA / "pp_healthy_n4", tmp_path / "pp"))
    for top in pipeline.values():
        assert not any(e["profiling_name"] == "nccl:coalesced" for e in top["entries"])
        assert all(e["retired"] for e in top["entries"] if e.get("is_p2p"))


def test_members_without_their_closing_entry_stay_pending(tmp_path: Path) -> None:
    """A dump taken mid-batch (members recorded, endCoalescing not yet): the members are all there is."""
    tops = _batched_upto(tmp_path, 7)
    top = tops[0]
    top["entries"] = top["entries"][:-2]  # the all_reduce #7 and batch #7's nccl:coalesced entry
    assert top["entries"][-1]["profiling_name"].startswith("nccl:recv")
    track = next(g for g in summarize(parse_dump(top, rank=0, source="r", is_json=False)).groups)
    assert [(p.seq, p.state, p.p2p) for p in track.pending] == [(7, "scheduled", True)] * 2


@pytest.mark.parametrize("closing", ["completed", "started", None])
def test_a_coalesced_collective_reads_as_its_closing_entry(closing: str | None, tmp_path: Path) -> None:
    """Slow-path coalesced collectives (torch 2.7+): per-op entries share the closing entry's
    ``collective_seq_id``, carry no state of their own, and take the closing entry's."""
    top = _batched_upto(tmp_path, 7)[0]
    last = next(e for e in reversed(top["entries"]) if e["profiling_name"] == "nccl:all_reduce")
    seq = last["collective_seq_id"] + 1
    ops = [
        dict(last, collective_seq_id=seq, state="scheduled", retired=False, duration_ms=None)
        for _ in range(2)
    ]
    for e in ops:
        e.update(time_discovered_started_ns=None, time_discovered_completed_ns=None)
    if closing is not None:
        done = closing == "completed"
        ops.append(
            dict(last, collective_seq_id=seq, profiling_name="nccl:coalesced", state=closing, retired=done)
        )
    top["entries"] = top["entries"] + ops
    for n, e in enumerate(top["entries"]):
        e["record_id"] = n
    for dump_coerce in (False, True):
        summary = summarize(parse_dump(top, rank=0, source="r", is_json=False), coerce=dump_coerce)
        track = next(g for g in summary.groups if g.enq == seq)
        states = [p.state for p in track.pending if p.seq == seq and not p.p2p]
        if closing == "completed":
            assert states == [] and track.done == seq
        elif closing == "started":
            assert states == ["started"] * 3 and track.done < seq
        else:
            assert states == ["scheduled"] * 2 and track.done < seq


@pytest.mark.parametrize("only_active", [False, True])
def test_live_heads_of_a_paused_batched_job_hold_no_send_recv(only_active: bool, tmp_path: Path) -> None:
    """The healthy batched job standing still for 30 min (a checkpoint, an eval): its batches' member ops
    never complete in the recorder, and an ``onlyActive`` snapshot (what the probe takes) skips only
    entries with a completion time — so it lists every member and none of their completed closing
    entries. Read per op, that was 'all 4 ranks blocked in send/recv' (p2p_stalled); as batches, nothing
    is in flight."""
    tops = _batched_upto(tmp_path, 7)
    if only_active:
        for top in tops.values():
            top["entries"] = [e for e in top["entries"] if e.get("time_discovered_completed_ns") is None]
        assert all(any(e.get("is_p2p") for e in top["entries"]) for top in tops.values())
    assert _live_stuck(tops, [0.5 + 60.0 * i for i in range(30)]) == []

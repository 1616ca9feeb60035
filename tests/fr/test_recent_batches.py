"""The newest-entries decode of NCCL pipeline dumps whose send/recv go through ``batch_isend_irecv``.

ProcessGroupNCCL writes every member of a coalesced batch ``scheduled``, not retired, without times,
forever, and closes the batch with a ``nccl:coalesced`` entry (same group and ``p2p_seq_id``) that
carries its state (``tests/fr/p2p_synth.py``). The skipped middle of such a dump is done only where every
unretired member is closed by a later completed closer (``sentinel.fr.recent._skipped_done``): these
tests hold the newest-entries reading against the full decode, with pending members and closers placed
in the first entries, the middle, across either boundary and among the newest entries.
"""

from __future__ import annotations

import pickle
from array import array
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.loader import _recent_dump, load_dump
from sentinel.fr.recent import HEAD, ByteView, decode_recent
from sentinel.fr.safepickle import loads_plain
from sentinel.fr.summary import summarize
from tests.fr.nccl_synth import mark_completed, mark_pending, started_at
from tests.fr.p2p_synth import closers_flagged
from tests.fr.synth import T0

KEEP = 128  # the newest entries the analysis keeps (sentinel.fr.dumpset.RECENT_ENTRIES)
ENTRIES = 1200
COLLECTIVES = 4  # world all_reduces per training step, before its batch
STEP = COLLECTIVES + 2  # entries of one unchanged step: its collectives, a batch's member and its closer
STEPS = ENTRIES // STEP + 20  # steps written (the dump keeps the newest ENTRIES entries of them)
WORLD = ("0", "default_pg")
FRAMES = [{"name": f"f{i}", "filename": "pipeline.py", "line": i} for i in range(6)]

#: What a change does to one batch.
CHANGES = (
    "closer_started",  # the closer is not completed (started): the batch still runs
    "closer_scheduled",  # the closer is not completed, merely scheduled
    "no_closer",  # the dump was taken mid-batch: no closer after the members
    "closer_other_seq",  # the entry after the members closes another batch
    "closer_other_group",  # the closer is another group's
    "pending_between",  # an op of the group still pending between the members and the closer
    "other_group_between",  # a completed entry of another group between the members and the closer
    "member_done",  # a member completed on its own (harmless)
    "last_done",  # the last of two members completed on its own: the closer follows it
    "collective_between",  # a completed collective of the group between the members and the closer
    "two_members",  # a second member of the same batch (harmless)
    "lone_pending",  # a lone send/recv (not a batch) still pending behind later collectives
    "late_frame",  # the member refers to a stack frame first pickled in the entry before it
)


def _base(e: dict[str, Any], name: str, pg: tuple[str, str] = WORLD) -> dict[str, Any]:
    out = {
        "record_id": 0,
        "frames": list(FRAMES[:3]),
        "pg_id": int(pg[0]),
        "process_group": pg,
        "profiling_name": name,
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "timeout_ms": 600000,
    }
    out.update(e)
    return out


def _rank_entries(
    rank: int, steps: int, changes: dict[int, list[str]]
) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """A 2-stage pipeline rank's buffer: per step :data:`COLLECTIVES` world all_reduces and one batch (rank 0 sends to 1,
    rank 1 receives from 0) closed by a completed ``nccl:coalesced``; ``changes``: step -> what to change
    in that step's batch (:data:`CHANGES`). Also: step -> the index of its (first) member."""
    entries: list[dict[str, Any]] = []
    member_at: dict[int, int] = {}
    coll = p2p = 0
    t = T0
    for step in range(steps):
        for _ in range(COLLECTIVES):
            coll += 1
            t += 1000
            e = _base({"collective_seq_id": coll, "p2p_seq_id": p2p, "op_id": coll + p2p}, "nccl:all_reduce")
            e.update(time_created_ns=t, input_sizes=[[64]], output_sizes=[[64]], is_p2p=False)
            mark_completed(e)
            entries.append(e)
        todo = changes.get(step, [])
        p2p += 1
        arrow, op = ("0->1", "send") if rank == 0 else ("1<-0", "recv")
        members = [f"nccl:{op} {arrow}"]
        if "two_members" in todo or "last_done" in todo:
            members.append("nccl:recv 0<-1" if rank == 0 else "nccl:send 1->0")
        batch: list[dict[str, Any]] = []
        member_at[step] = len(entries)
        for name in members:
            t += 1000
            e = _base({"collective_seq_id": coll, "p2p_seq_id": p2p, "op_id": coll + p2p}, name)
            e.update(time_created_ns=t, input_sizes=[[1024]], output_sizes=[[1024]], is_p2p=True)
            if "late_frame" in todo:  # one dict shared by both entries: memoized in the first
                frame = {"name": f"late{step}", "filename": "pipeline.py", "line": step}
                entries[-1]["frames"].append(frame)
                e["frames"].append(frame)
            if "member_done" in todo or ("last_done" in todo and len(batch) == len(members) - 1):
                mark_completed(e)
            else:
                mark_pending(e, None)
            batch.append(e)
        if "lone_pending" in todo:
            mark_pending(batch[0], started_at(batch[0]))
            entries += batch
            continue
        t += 1000
        closer = _base({"collective_seq_id": coll, "p2p_seq_id": p2p, "op_id": coll + p2p}, "nccl:coalesced")
        closer.update(time_created_ns=t, input_sizes=[], output_sizes=[], is_p2p=True)
        closer.update(input_dtypes=[], output_dtypes=[])
        mark_completed(closer)
        if "closer_started" in todo:
            mark_pending(closer, started_at(closer))
        if "closer_scheduled" in todo:
            mark_pending(closer, None)
        if "closer_other_seq" in todo:
            closer["p2p_seq_id"] = p2p + 1000
        if "closer_other_group" in todo:
            closer.update(pg_id=1, process_group=("1", "pp"))
        if "pending_between" in todo:
            e = _base({"collective_seq_id": coll, "p2p_seq_id": p2p + 500, "op_id": 0}, members[0])
            e.update(time_created_ns=t, input_sizes=[[8]], output_sizes=[[8]], is_p2p=True)
            mark_pending(e, None)
            batch.append(e)
        if "collective_between" in todo:  # (this rank's later collectives count one more)
            coll += 1
            e = _base({"collective_seq_id": coll, "p2p_seq_id": p2p, "op_id": coll + p2p}, "nccl:barrier")
            e.update(time_created_ns=t, input_sizes=[[1]], output_sizes=[[1]], is_p2p=False)
            mark_completed(e)
            batch.append(e)
            closer["collective_seq_id"] = coll
        if "other_group_between" in todo:
            e = _base(
                {"collective_seq_id": step, "p2p_seq_id": 0, "op_id": step}, "nccl:barrier", ("1", "pp")
            )
            e.update(time_created_ns=t, input_sizes=[[1]], output_sizes=[[1]], is_p2p=False)
            mark_completed(e)
            batch.append(e)
        if "no_closer" not in todo:
            batch.append(closer)
        entries += batch
    return entries, member_at


def _write_set(
    root: Path,
    shift: int,
    changes: dict[int, dict[int, list[str]]],
    anchor: tuple[int, int, int] | None = None,
    flag: bool | None = True,
    skew: int = 0,
) -> list[Path]:
    """Two ranks' dumps of the newest :data:`ENTRIES` entries, ``shift`` more dropped from the end (moves
    every batch relative to the boundaries); ``changes``: rank -> step -> changes. ``anchor`` (rank, step,
    index) sets the shift instead: that rank's member of that step is entry ``index`` of its dump (a batch
    across a boundary), when the buffer holds enough entries on both sides. ``flag``: what the closers'
    ``is_p2p`` says (:func:`tests.fr.p2p_synth.closers_flagged`: False as torch 2.5 writes it, None: no
    entry has the key). ``skew``: the other rank (rank 1 without ``anchor``) drops that many more (its
    boundaries fall elsewhere in its steps)."""
    root.mkdir(parents=True, exist_ok=True)
    written = {rank: _rank_entries(rank, STEPS, changes.get(rank, {})) for rank in (0, 1)}
    if anchor is not None:
        entries, member_at = written[anchor[0]]
        start = member_at[anchor[1]] - anchor[2]
        if 0 <= start <= len(entries) - ENTRIES - 1:
            shift = len(entries) - ENTRIES - start
    paths = []
    for rank, (all_entries, _) in written.items():
        skewed = rank != (anchor[0] if anchor is not None else 0)
        kept = len(all_entries) - shift - skew * skewed
        entries = all_entries[:kept][-ENTRIES:]
        for n, e in enumerate(entries, start=kept - len(entries)):
            e["record_id"] = n  # (the buffer wrapped: its oldest entry is not the job's first)
        seqs = [e["collective_seq_id"] for e in entries if e["pg_id"] == 0 and not e["is_p2p"]]
        status = {
            "0": {
                "last_enqueued_collective": max(seqs),
                "last_started_collective": max(seqs),
                "last_completed_collective": max(seqs),
            }
        }
        config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
        top = {"version": "2.10", "pg_config": config, "pg_status": status, "entries": entries}
        closers_flagged({rank: top}, flag)
        path = root / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(top, protocol=2))
        paths.append(path)
    return paths


def _pending(path: Path, recent: int | None) -> tuple[int, dict[str, list[Any]], dict[str, Any]]:
    """(entries decoded, group -> its pending ops after the reduction, group -> its track) of one dump."""
    dump = load_dump(path, recent=recent)
    summary = summarize(dump)
    pending = {g.name: list(g.pending) for g in summary.groups if g.pending}
    return len(dump.entries), pending, {g.name: g for g in summary.groups}


def _same_newest_columns(recent: Any, full: Any) -> None:
    """The collectives of a group read from the newest entries carry the same match keys and times as
    in the full decode's reading, and its send/recv log is the end of the full one."""
    keys, times = array("I", recent.keys), array("q", recent.times)
    full_keys, full_times = array("I", full.keys), array("q", full.times)
    at = recent.first_seq - full.first_seq
    assert at >= 0
    assert keys.tolist() == full_keys[at : at + len(keys)].tolist(), recent.name
    assert times.tolist() == full_times[at : at + len(times)].tolist(), recent.name
    log, full_log = array("q", recent.p2p_log), array("q", full.p2p_log)
    assert log.tolist() == full_log[len(full_log) - len(log) :].tolist(), recent.name


def _check_against_full(paths: list[Path]) -> list[bool]:
    """Per dump: when it is read from its newest entries (decoded at both ends, or decoded in full and
    reduced from its newest entries), the pending ops after the reduction equal the full decode's, and so
    do the newest collectives' columns. Returns which dumps the two-ended decode alone accepted (whose
    scan of the skipped middle these tests are about): each of them is read from its newest entries."""
    read_recent = []
    for path in paths:
        n, pending, tracks = _pending(path, KEEP)
        full_n, full_pending, full_tracks = _pending(path, None)
        assert full_n == ENTRIES
        if n == KEEP:
            assert pending == full_pending, path.name
            for name, track in tracks.items():
                _same_newest_columns(track, full_tracks[name])
        data = path.read_bytes()
        assert len(data) >= ByteView.CHUNK  # (read at both ends from the file, as load_dump reads it)
        ends = _recent_dump(decode_recent(data, KEEP), str(path), 0, False) is not None
        assert n == KEEP or not ends, path.name
        read_recent.append(ends)
    return read_recent


def _verdict(result: Any) -> tuple[Any, ...]:
    j = result.to_json()
    return j["verdict"], j["culprit_ranks"], j["collective"], j["summary"]


_BATCH_CHANGES = st.lists(st.sampled_from(CHANGES), min_size=1, max_size=2)
#: Steps of the buffer (with no shift): the front (first entries), the newest entries' front, the end.
FRONT = STEPS - ENTRIES // STEP
NEWEST = STEPS - KEEP // STEP


Case = tuple[int, dict[int, dict[int, list[str]]], tuple[int, int, int] | None, bool | None, int]


@st.composite
def _changed_sets(draw: st.DrawFn) -> Case:
    """Changes to batches anywhere (a step drawn near the first entries' end, near the newest entries'
    start, among the newest, or anywhere), a shift, and maybe a changed batch placed across a boundary:
    its member a few entries before or after the end of the first entries or the start of the newest;
    the other rank's boundaries skewed against it by up to a step (a closer first among one rank's newest
    entries, its collective among the other's)."""
    shift = draw(st.integers(0, 2 * STEP))
    skew = draw(st.integers(0, STEP))
    near = [FRONT + HEAD // STEP + d for d in (-1, 0, 1)] + [NEWEST + d for d in (-2, -1, 0, 1)]
    where = st.one_of(st.sampled_from(near), st.integers(FRONT, STEPS - 1))
    changes: dict[int, dict[int, list[str]]] = {}
    for _ in range(draw(st.integers(0, 3))):
        rank = draw(st.sampled_from([0, 1]))
        changes.setdefault(rank, {})[draw(where)] = draw(_BATCH_CHANGES)
    anchor = None
    if draw(st.booleans()):
        rank = draw(st.sampled_from([0, 1]))
        at_front = draw(st.booleans())
        step = FRONT + 3 if at_front else NEWEST - 3
        # a member completed on its own leaves its closer behind no pending member: one that does not
        # say is_p2p, first among the newest entries, is read as a collective there (drawn more often)
        changes.setdefault(rank, {})[step] = draw(st.one_of(st.just(["member_done"]), _BATCH_CHANGES))
        index = (HEAD if at_front else ENTRIES - KEEP) + draw(st.integers(-3, 1))
        anchor = (rank, step, index)
    flag = draw(st.sampled_from([True, False, None]))
    return shift, changes, anchor, flag, skew


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_changed_sets())
def test_fuzz_batched_pipeline_dumps_read_from_their_newest_entries_as_in_full(
    tmp_path_factory: Any, case: Case
) -> None:
    """Pending members and closers anywhere — first entries, middle, either boundary (a batch split
    between skipped and decoded entries), newest entries — with closers not completed, missing, of
    another batch or group, blocked by a pending op, flagged ``is_p2p`` True, False or not at all, each
    rank's newest entries starting anywhere in its steps: the newest-entries reading gives the same
    pending ops and columns per dump and the same verdict for the set as the full decode."""
    shift, changes, anchor, flag, skew = case
    root = tmp_path_factory.mktemp("set")
    paths = _write_set(root, shift, changes, anchor, flag, skew)
    _check_against_full(paths)
    assert _verdict(analyze_dir(root, workers=0)) == _verdict(analyze_dir(root, workers=0, recent=None))


def test_a_healthy_batched_pipeline_is_read_from_its_newest_entries(tmp_path: Path) -> None:
    """Whatever the closers' ``is_p2p`` says (True 2.7+, False 2.5, absent)."""
    for flag in (True, False, None):
        root = tmp_path / str(flag)
        paths = _write_set(root, 0, {}, flag=flag)
        assert _check_against_full(paths) == [True, True]
        assert all(load_dump(p, recent=KEEP).skipped_p2p for p in paths)
        assert analyze_dir(root, workers=0).to_json()["verdict"] == "healthy"


MIDDLE = FRONT + ENTRIES // STEP // 2  # a step in the middle of the buffer (none of its entries decoded)

#: The step whose batch straddles the end of the first entries (a step's member is its next to last entry).
AT_HEAD = FRONT + max(0, HEAD - 7) // STEP


def _rank0_read_recent(
    tmp_path: Path, changes: list[str], step: int, index: int | None = None, flag: bool | None = True
) -> bool:
    """Whether rank 0's dump, with ``changes`` to the batch of ``step`` (its member at entry ``index``),
    is read from its newest entries; either way the pending ops equal the full decode's."""
    anchor = None if index is None else (0, step, index)
    paths = _write_set(tmp_path, 0, {0: {step: changes}}, anchor, flag)
    if index is not None:
        entries = load_dump(paths[0]).entries
        member = entries[index]
        assert member["profiling_name"].startswith("nccl:send") and member["retired"] is False
    read = _check_against_full(paths)
    assert read[1] or flag is not True, "rank 1 is unchanged (but for unflagged closers at the same place)"
    return read[0]


def test_batches_in_the_middle_closed_or_not(tmp_path: Path) -> None:
    """In the skipped middle: a batch whose members are closed by a completed closer of their group and
    ``p2p_seq_id`` is done; one whose closer is not completed, absent, of another batch or group, or
    behind a pending op or another entry (not proven: a full decode), or a lone op still pending, is
    not shown done; a member that refers to a frame pickled in a skipped entry is decoded in full."""
    done = {"member_done", "two_members"}  # (last_done: its closer is two entries past the hit: a doubt)
    for change in CHANGES:
        got = _rank0_read_recent(tmp_path / change, [change], MIDDLE)
        assert got == (change in done), change


def test_a_batch_across_the_newest_entries_boundary(tmp_path: Path) -> None:
    """The last skipped entry is a member: its closer, the first of the newest entries, must be
    completed (the newest entries are reduced as decoded: a pending closer there would speak for the
    skipped member in the full decode only)."""
    last_skipped = ENTRIES - KEEP - 1
    assert _rank0_read_recent(tmp_path / "a", [], NEWEST - 3, last_skipped)
    assert not _rank0_read_recent(tmp_path / "b", ["closer_started"], NEWEST - 3, last_skipped)
    assert not _rank0_read_recent(tmp_path / "c", ["closer_scheduled"], NEWEST - 3, last_skipped)
    assert not _rank0_read_recent(tmp_path / "d", ["no_closer"], NEWEST - 3, last_skipped)
    assert not _rank0_read_recent(tmp_path / "e", ["pending_between"], NEWEST - 3, last_skipped)
    # two members on either side of the boundary, the closer among the newest entries
    assert _rank0_read_recent(tmp_path / "f", ["two_members"], NEWEST - 3, last_skipped)
    assert not _rank0_read_recent(tmp_path / "g", ["two_members", "closer_started"], NEWEST - 3, last_skipped)
    # a closer that does not say is_p2p (torch 2.5: False; or no key) is known by the member before it:
    # the newest entries alone, beginning with it, would read it as a collective — a full decode; behind
    # a member of its batch among the newest entries it is read as the full decode reads it
    for flag in (False, None):
        assert not _rank0_read_recent(tmp_path / f"h{flag}", [], NEWEST - 3, last_skipped, flag)
        assert _rank0_read_recent(tmp_path / f"i{flag}", ["two_members"], NEWEST - 3, last_skipped, flag)
        # a completed collective between the members and that closer: it follows no member, a collective
        # to both readings, and the skipped member stays pending in the full decode only
        changes = ["two_members", "collective_between"]
        assert not _rank0_read_recent(tmp_path / f"j{flag}", changes, NEWEST - 3, last_skipped, flag)
    # flagged, the closer closes the batch in both readings, whatever came between
    changes = ["two_members", "collective_between"]
    assert _rank0_read_recent(tmp_path / "k", changes, NEWEST - 3, last_skipped, True)


def test_a_batch_across_the_first_entries_boundary(tmp_path: Path) -> None:
    """The last of the first (decoded) entries is a member, its closer the first skipped entry."""
    assert HEAD >= 2
    assert _rank0_read_recent(tmp_path / "a", [], AT_HEAD, HEAD - 1)
    assert not _rank0_read_recent(tmp_path / "b", ["closer_started"], AT_HEAD, HEAD - 1)
    assert not _rank0_read_recent(tmp_path / "c", ["no_closer"], AT_HEAD, HEAD - 1)
    assert _rank0_read_recent(tmp_path / "d", ["two_members"], AT_HEAD, HEAD - 2)
    # a completed collective between the member and its closer: an unflagged closer follows no member
    # (the member stays pending in the full decode), a flagged one closes the batch
    for flag in (False, None):
        assert not _rank0_read_recent(tmp_path / f"e{flag}", ["collective_between"], AT_HEAD, HEAD - 1, flag)
    assert _rank0_read_recent(tmp_path / "f", ["collective_between"], AT_HEAD, HEAD - 1, True)


def test_a_pending_batch_among_the_newest_entries_is_read_from_them(tmp_path: Path) -> None:
    """Nothing skipped is pending: the newest entries hold the batch (and the set, where a rank waits,
    is read again in full: the verdicts agree)."""
    assert _rank0_read_recent(tmp_path / "a", ["closer_started"], STEPS - 3)
    assert _verdict(analyze_dir(tmp_path / "a", workers=0)) == _verdict(
        analyze_dir(tmp_path / "a", workers=0, recent=None)
    )


def test_many_hits_in_one_entry_are_one_span(tmp_path: Path) -> None:
    """A stack frame in the middle whose name holds the bytes of "retired: False" thousands of times (the
    key's BINGET then NEWFALSE): every hit lies in that entry's span, searched once, not once a hit; the
    entry is completed, so the newest entries are enough, and read as the full decode reads them."""
    paths = _write_set(tmp_path, 0, {})
    top = loads_plain(paths[0].read_bytes())
    blob = paths[0].read_bytes()
    at = blob.index(b"X\x07\x00\x00\x00retired") + 12
    assert blob[at] == ord("q") and blob[at + 1] < 0x80  # BINPUT of a one-byte (ASCII) index
    text = (b"h" + blob[at + 1 : at + 2] + b"\x89").decode("latin-1") * 5000
    top["entries"][ENTRIES // 2]["frames"] = [{"name": text, "filename": "pipeline.py", "line": 1}]
    paths[0].write_bytes(pickle.dumps(top, protocol=2))
    assert _check_against_full(paths) == [True, True]


def test_an_unflagged_closer_first_among_the_newest_entries(tmp_path: Path) -> None:
    """A closer that says ``is_p2p`` False (torch 2.5) or nothing, with no pending member before it (its
    member completed on its own), the first of rank 0's newest entries, while rank 1's newest entries
    start two entries earlier (at the all_reduce of that closer's ``collective_seq_id``): the newest
    entries alone read it as a collective, a column of its own, where the full decode knows it by the
    member right before it. Read so, rank 0 "called coalesced where the others call all_reduce" in a
    healthy set; it is decoded in full instead. With its member first among the newest entries, both
    readings know the closer by it: the newest entries are enough."""
    step = NEWEST - 3
    changes = {0: {step: ["member_done"]}}
    for flag in (True, False, None):
        for first in ("closer", "member"):
            root = tmp_path / f"{flag}_{first}"
            index = ENTRIES - KEEP - (first == "closer")  # the member's
            paths = _write_set(root, 0, changes, (0, step, index), flag, skew=2)
            closer = load_dump(paths[0]).entries[index + 1]
            assert closer["profiling_name"] == "nccl:coalesced" and closer.get("is_p2p") is flag
            assert _check_against_full(paths) == [flag is True or first == "member", True]
            recent, full = analyze_dir(root, workers=0), analyze_dir(root, workers=0, recent=None)
            assert recent.to_json() == full.to_json()
            # (closer first, rank 1's buffer ends mid-batch: its recv not yet closed)
            assert full.to_json()["verdict"] == ("healthy" if first == "member" else "inconclusive")

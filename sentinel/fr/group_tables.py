"""What a dump's ``pg_status`` and ``pg_config`` tables add to its entries.

``pg_status`` gives each group's last enqueued, started and completed collective (gloo counts ops there,
mapped back to collective seqs); ``pg_config`` gives the members where it is sound (NCCL).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from itertools import pairwise

from sentinel.fr.errors import FrFormatError, brief
from sentinel.fr.group_builder import INT_MAX, INT_MIN, GroupBuilder
from sentinel.fr.loader import RawDump
from sentinel.fr.ops import (
    UNRECORDED_P2P_BACKENDS,
)
from sentinel.fr.rank_summary import GroupTrack
from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def _int(value: Any, what: str, source: str) -> int:
    if type(value) is int:
        if INT_MIN <= value <= INT_MAX:
            return value
    elif type(value) is float and value.is_integer() and INT_MIN <= value < INT_MAX:
        return int(value)  # read losslessly as the integer, as entry fields are (sentinel.fr.coerce)
    elif isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        number = int(value)
        if INT_MIN <= number <= INT_MAX:
            return number
    raise FrFormatError(f"{source}: {what} is {brief(value)}, expected a 64-bit integer")


def apply_status(
    dump: RawDump, groups: list[GroupTrack], source: str, builders: dict[int, GroupBuilder]
) -> None:
    by_id = {g.pg_id: g for g in groups if g.pg_id >= 0}
    for pg_id, status in dump.pg_status.items():
        if not isinstance(status, dict):
            raise FrFormatError(f"{source}: pg_status[{brief(pg_id, 20)}] is not a dict")
        key = _int(pg_id, "pg_status key", source)
        group = by_id.get(key)
        if group is None:
            named = dump.pg_names.get(key)
            if named is None or any(g.name == named[0] for g in groups):
                continue  # a group whose entries all left the ring buffer: its name is unknown
            desc = "" if named[1] == "undefined" else named[1]
            group = by_id[key] = GroupTrack(name=named[0], desc=desc, pg_id=key)
            groups.append(group)
        at = f"pg_status[{brief(pg_id, 20)}]:"
        enq = _int(status.get("last_enqueued_collective", -1), f"{at} last_enqueued_collective", source)
        done = _int(status.get("last_completed_collective", -1), f"{at} last_completed_collective", source)
        started = _int(status.get("last_started_collective", -1), f"{at} last_started_collective", source)
        b = builders.get(key)
        if b is not None and (b.p2p_log or (b.p2p_count > 0 and b.backend not in UNRECORDED_P2P_BACKENDS)):
            # a group that ran send/recv (entries of them, or a count of them on its collectives' entries
            # when theirs left the ring buffer): ProcessGroupNCCL's values are the last *work*'s seq, a
            # send/recv's (or its batch's) from the p2p counter (torch 2.5 initWork: isP2P ? seqP2P_ :
            # seqCollective_): a completed recv #8 read as collective #8 marked a pending all_reduce #7
            # completed, and recv #120 completed before all_reduce #7-#50 (all pending) marked every one of
            # them completed. Its entries say where its collectives are (they complete in order on its
            # stream); the count agrees with the newest entries' (sentinel.fr.loader._counts_p2p)
            continue
        if b is not None and _counts_ops(b, enq):
            ascending = _ascending(b.ops)  # once per group, not per value mapped
            enq, done, started = (_seq_of_op(b, v, ascending) for v in (enq, done, started))
        group.enq = max(group.enq, enq)
        group.done = max(group.done, done)
        group.started = max(group.started, started)
    for group in groups:
        if group.done >= 0:
            group.pending = [p for p in group.pending if p.p2p or p.seq > group.done]


def _counts_ops(b: GroupBuilder, enq: int) -> bool:
    """Whether this group's pg_status counts *operations* rather than collectives.

    ProcessGroupGloo (torch 2.13) publishes its own op counter there — one that also counts send/recv,
    which it does not record in the flight recorder — while the entries' ``collective_seq_id`` counts
    collectives only; the entries' ``op_id`` is that op counter. ProcessGroupNCCL counts collectives in
    both. Entries are recorded when a collective is enqueued, so the status's last enqueued value is the
    newest entry's: its ``op_id`` under gloo, its ``collective_seq_id`` under NCCL. Only when the two
    differ (the job ran point-to-point ops) and the status names the op id are the values translated."""
    if not b.seqs:
        return False
    newest_seq, newest_op = b.seqs[-1], b.ops[-1]
    return newest_op >= 0 and newest_op != newest_seq and enq == newest_op


def _seq_of_op(b: GroupBuilder, op_id: int, ascending: bool) -> int:
    """The collective seq whose entry is the newest with ``op_id`` at most the given one (-1 passes)."""
    if op_id < 0:
        return op_id
    ops = b.ops
    i = bisect_right(ops, op_id) if ascending else sum(1 for o in ops if o <= op_id)
    if i == 0:  # older than every entry in the ring buffer: just before the first
        return int(b.seqs[0]) - 1 if b.seqs else -1
    return int(b.seqs[i - 1])


def _ascending(values: list[int]) -> bool:
    return all(a <= c for a, c in pairwise(values))


def apply_config(dump: RawDump, groups: list[GroupTrack]) -> int:
    """Use pg_config when it is sound (NCCL); gloo in torch 2.13 writes one unnamed entry (key, name and
    desc empty) whose ranks are empty once the job made sub-groups and the world's ranks when it made none.

    Returns one more than the highest rank any entry lists (0: none): an unnamed entry belongs to no group
    the entries name, but the ranks it lists are ranks of the job, so the world is at least that large —
    the only trace in gloo dumps of a world-only job's highest rank when that rank left no dump."""
    by_name = {g.name: g for g in groups}
    listed = 0
    for key, cfg in dump.pg_config.items():
        if not isinstance(cfg, dict):
            continue
        name = cfg.get("name", key)
        if not isinstance(name, str):  # a malformed entry: nothing of it is used
            continue
        value = cfg.get("ranks")
        # cached by text (bounded: at most 256 texts of at most 256 KiB)
        runs = _runs_of_text(value) if isinstance(value, str) and len(value) <= 1 << 18 else _runs_of(value)
        if runs:
            listed = max(listed, runs[-1][1])
        group = by_name.get(name) if name else None
        if group is None:
            continue
        if runs:
            group.config_ranks = list(runs)
        if not group.desc and isinstance(cfg.get("desc"), str):
            group.desc = cfg["desc"]
    return listed


def rank_runs(ranks: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct ranks as [start, stop) runs."""
    if ranks and ranks[-1] - ranks[0] + 1 == len(ranks):  # one run (the usual case; ranks are distinct)
        return [(ranks[0], ranks[-1] + 1)]
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


#: Member-list texts parsed so far, by (length, first and last characters): see :func:`_runs_of_text`.
_RUNS_SEEN: dict[tuple[int, str, str], list[tuple[str, tuple[tuple[int, int], ...] | None]]] = {}


_RUNS_SEEN_MAX = 256


def _runs_of_text(text: str) -> tuple[tuple[int, int], ...] | None:
    """Every dump of a job repeats the same member lists (16,384 ranks for the world): parse each once.

    Found again by equality, not by hash: each dump decodes its own copy of the text, whose hash (an
    ``lru_cache`` key) would cost a pass over the whole text per dump, where comparing it with the one seen
    is a memcmp. Bounded: at most :data:`_RUNS_SEEN_MAX` texts are kept."""
    seen = _RUNS_SEEN.setdefault((len(text), text[:16], text[-16:]), [])
    for known, runs in seen:
        if known == text:
            return runs
    ranks = _parse_ranks(text)
    runs = tuple(rank_runs(ranks)) if ranks else None
    if sum(map(len, _RUNS_SEEN.values())) >= _RUNS_SEEN_MAX:
        _RUNS_SEEN.clear()
        seen = _RUNS_SEEN.setdefault((len(text), text[:16], text[-16:]), [])
    seen.append((text, runs))
    return runs


def _runs_of(value: Any) -> tuple[tuple[int, int], ...] | None:
    ranks = _parse_ranks(value)
    return tuple(rank_runs(ranks)) if ranks else None


def _parse_ranks(value: Any) -> list[int] | None:
    if isinstance(value, str):
        if len(value) > 1 << 22:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # unusable, as any other member list that is not one
            return None
    if isinstance(value, list) and value and set(map(type, value)) == {int}:
        ranks = sorted(set(value))
        if ranks[0] >= 0 and ranks[-1] < 1 << 24:
            return ranks
    return None

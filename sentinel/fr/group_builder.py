"""The columns of one process group built while a dump is reduced, and the GroupTrack made of them.

Also counts the ops that left no entry: gloo records no send/recv, only a gap in ``op_id``.
"""

from __future__ import annotations

from array import array

from sentinel.fr.ops import (
    UNRECORDED_P2P_BACKENDS,
)
from sentinel.fr.rank_summary import P2P_LOG, GroupTrack, Pending

#: Integers the format carries (seqs, times, ids) are int64 in PyTorch; anything outside is refused.
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1


class GroupBuilder:
    __slots__ = (
        "backend",
        "desc",
        "done",
        "enq",
        "hints",
        "keys",
        "last_seq",
        "member",
        "name",
        "ops",
        "p2p_count",
        "p2p_log",
        "pending",
        "pg_id",
        "seqs",
        "times",
    )

    def __init__(self, name: str, desc: str, pg_id: int) -> None:
        self.name = name
        self.desc = desc
        self.pg_id = pg_id
        # columns as lists, made arrays once in finish_track: list.append costs a fifth of array.append, and
        # four appends per entry were a quarter of reducing a dump
        self.seqs: list[int] = []
        self.ops: list[int] = []  # op_id of each seq's (last) entry: maps gloo's pg_status to seqs
        self.keys: list[int] = []
        self.times: list[int] = []
        self.pending: list[Pending] = []
        self.enq = -1
        self.done = -1
        self.last_seq = INT_MIN - 1  # no seq: an entry without one (-1) is not a coalesced op of the last
        self.hints: set[int] = set()
        self.p2p_log: list[int] = []
        # p2p_seq_id of the newest collective: the group's send/recv so far, whether or not their entries
        # are still in the buffer (a counter that only grows: the newest entry's is the group's largest)
        self.p2p_count = 0
        self.backend: str | None = None  # None until the first entry names one
        # (p2p_seq_id, len(seqs) then) of the group's newest send/recv while no collective came after it:
        # the member a closing entry right behind it follows. A collective entry either adds a column
        # (len(seqs) moves on) or folds into the last one (which clears this), so no entry pays for it
        self.member: tuple[int, int] | None = None


def finish_track(b: GroupBuilder) -> GroupTrack:
    seqs = b.seqs
    keys = array("I", b.keys)
    times = array("q", b.times)
    first = seqs[0] if seqs else 0
    # consecutive seqs (the usual case) are checked in one C-level comparison, not a loop per entry
    if seqs and (seqs[-1] - first + 1 != len(seqs) or seqs != list(range(first, first + len(seqs)))):
        # holes or disorder (ring-buffer oddities): lay the columns out densely by seq
        lo, hi = min(seqs), max(seqs)
        if hi - lo > 4 * len(seqs) + 1024:
            lo = max(lo, hi - 4 * len(seqs) - 1024)
        dense_k = array("I", bytes(4 * (hi - lo + 1)))
        dense_t = array("q", bytes(8 * (hi - lo + 1)))
        for s, k, t in zip(seqs, keys, times, strict=True):
            if s >= lo:
                dense_k[s - lo] = k
                dense_t[s - lo] = t
        first, keys, times = lo, dense_k, dense_t
    return GroupTrack(
        name=b.name,
        desc=b.desc,
        pg_id=b.pg_id,
        enq=b.enq,
        done=b.done,
        first_seq=first,
        keys=keys.tobytes(),
        times=times.tobytes(),
        pending=b.pending,
        size_hints=sorted(b.hints),
        p2p_log=array("q", b.p2p_log[-2 * P2P_LOG :]).tobytes(),
        unrecorded_ops=_unrecorded(b),
        backend=b.backend or "",
        repeat_gap=_gap_after_repeat(b),
    )


#: Most recent collectives per group over which ops that left no entry are counted (p2p the job still runs,
#: not a send/recv at its start).
UNRECORDED_WINDOW = 64


def _unrecorded(b: GroupBuilder) -> int:
    """Ops between this group's newest recorded collectives that left no entry (``op_id`` gaps).

    Keyed on the backend the entries name, never on the gaps alone: only a backend that records no
    send/recv (gloo) leaves a gap for every send/recv it ran. ProcessGroupNCCL writes an entry per
    send/recv, so gaps in NCCL dumps (a wrapped buffer, entries that are simply not there, a coalesced
    batch counted per op) say nothing about p2p and the NCCL rules judge them. 0 as well when the entries
    number no ops (op_id -1) or the group's entries name several backends (two op counters interleave)."""
    ops = b.ops
    first = max(0, len(ops) - 1 - UNRECORDED_WINDOW)
    if b.backend not in UNRECORDED_P2P_BACKENDS or len(ops) < 2 or b.p2p_log or ops[first] < 0:
        return 0
    # the sum of the gaps of an ascending sequence, in O(1): a full 2,000-entry buffer of 16,384 ranks
    # must not cost a Python loop per entry
    return max(0, ops[-1] - ops[first] - (len(ops) - 1 - first))


def _gap_after_repeat(b: GroupBuilder) -> int:
    """Ops that left no entry right after the newest earlier collective with the same match key as the
    group's newest one, within :data:`UNRECORDED_WINDOW`: a training loop repeats, so this is what the
    rank ran after its last collective in its earlier steps (gloo: its send/recv). -1 without an earlier
    one, for other backends, or without op ids. Evidence for a human, not a rule (see the analysis)."""
    keys, ops = b.keys, b.ops
    n = len(keys)
    if b.backend not in UNRECORDED_P2P_BACKENDS or n < 2 or not keys[-1] or ops[-1] < 0:
        return -1
    last = keys[-1]
    for j in range(n - 2, max(-1, n - 2 - UNRECORDED_WINDOW), -1):
        if keys[j] == last:
            return max(0, ops[j + 1] - ops[j] - 1)
    return -1

"""Collectives whose members passed different ops, sizes or dtypes, and send/recv pairs that disagree.

Such a mismatch blocks or aborts the collective, so it outranks the waits it causes; the majority of the
members says what was expected.
"""

from __future__ import annotations

import math
from collections import Counter

from sentinel.fr.lateness import TIMING_WINDOW
from sentinel.fr.membership import Group, key_at, time_at
from sentinel.fr.ops import is_send
from sentinel.fr.rank_summary import KeyInfo, Pending
from sentinel.fr.records import TYPE_CHECKING, NamedTuple
from sentinel.fr.waitgraph import Wait

if TYPE_CHECKING:
    from typing import Any


class MismatchFinding(NamedTuple):
    kind: str  # op | size | dtype
    group: Group
    seq: int
    ranks: list[int]
    expected: KeyInfo
    found: KeyInfo
    pending: bool
    p2p: bool = (
        False  # a send and its recv: ranks = [sender, receiver], found = the send, expected = the recv
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pg_name": self.group.name,
            "pg_desc": self.group.desc,
            "seq": self.seq,
            "ranks": self.ranks,
            "expected": _key_json(self.expected),
            "found": _key_json(self.found),
            "stalled": self.pending,
            **({"p2p": True} if self.p2p else {}),
        }


def _majority(
    votes: dict[int, int], group_keys: Counter[int], fewer: dict[int, int] | None = None
) -> tuple[int, list[int]]:
    """(expected key, ranks that differ): the most common key wins; a tie goes to the key this group uses
    more often elsewhere, then — when members of the group left no dump (``fewer``: key -> minus its
    elements, for the keys whose sizes are readable) — to the smaller tensors: a transport that refuses an oversized message aborts the ranks
    that held less than they were sent, so the ranks gone held the smaller size (a broadcast root that
    sends twice the elements to a world of 4 aborts two receivers; the survivors tie one to one)."""
    count = Counter(votes.values())
    rank_of = {}
    for r, v in sorted(votes.items(), reverse=True):
        rank_of[v] = r
    by = fewer or {}
    # a key whose size is unknown is never the smaller one
    expected = max(count, key=lambda k: (count[k], group_keys[k], by.get(k, -math.inf), -rank_of[k]))
    return expected, sorted(r for r, v in votes.items() if v != expected)


def _elements(sizes: str) -> int | None:
    """Elements of every tensor in a key's sizes text (``[[1024], [4, 8]]``; a scalar's shape ``[]`` holds
    one); None when a dimension is not a plain count (nothing is known of its size then)."""
    text = sizes.replace(" ", "")
    body = text[1:-1]  # within the outer brackets: "[1024],[4,8]"
    if text[:1] != "[" or text[-1:] != "]" or (body and (body[0] != "[" or body[-1] != "]")):
        return None
    if not body:
        return 0  # no tensors
    total = 0
    for shape in body[1:-1].split("],["):
        n = 1
        for dim in shape.split(",") if shape else ():
            if not dim.isdigit():
                return None
            n *= int(dim)
        total += n
    return total


def _mismatch_kind(a: KeyInfo, b: KeyInfo) -> str:
    if a.op != b.op:
        return "op"
    if (a.in_sizes, a.out_sizes) != (b.in_sizes, b.out_sizes):
        return "size"
    return "dtype"


def _group_key_counts(g: Group) -> Counter[int]:
    counts: Counter[int] = Counter()
    for t in g.tracks.values():
        mv = memoryview(t.keys).cast("I")
        counts.update(mv.tolist()[-TIMING_WINDOW:])
    return counts


def frontier_mismatch(
    groups: dict[str, Group], waits: list[Wait], keys: dict[int, KeyInfo]
) -> MismatchFinding | None:
    seen: set[tuple[str, int]] = set()
    for w in sorted(waits, key=lambda w: (w.t_ns, w.seq)):
        if w.p2p or (w.group, w.seq) in seen:
            continue
        seen.add((w.group, w.seq))
        g = groups[w.group]
        votes = {r: k for r, t in g.tracks.items() if t.enq >= w.seq and (k := key_at(t, w.seq))}
        if len(set(votes.values())) > 1:
            return _mismatch(g, w.seq, votes, keys, pending=True)
    return None


def p2p_mismatch(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> MismatchFinding | None:
    """The earliest pending send whose pending recv (the same pair, matched in order) holds a tensor of
    another size or dtype, as PyTorch's analyzer compares them: neither side can complete. Both ranks are
    named (the pair cannot say which one is wrong), the sender first."""
    best: tuple[int, MismatchFinding] | None = None
    for g in groups.values():
        order = sorted(g.members)
        sends: dict[tuple[int, int], list[Pending]] = {}
        recvs: dict[tuple[int, int], list[Pending]] = {}
        for rank, t in g.tracks.items():
            for p in t.pending:
                if not p.p2p or not 0 <= p.peer < len(order):
                    continue
                if is_send(p.op):
                    sends.setdefault((rank, order[p.peer]), []).append(p)
                else:
                    recvs.setdefault((order[p.peer], rank), []).append(p)
        for pair, out in sends.items():
            back = sorted(recvs.get(pair, ()), key=lambda p: (p.seq, p.t_ns))
            if len(back) != len(out):  # one side completed some: the pending ones need not pair up
                continue
            for s, r in zip(sorted(out, key=lambda p: (p.seq, p.t_ns)), back, strict=False):
                ks, kr = keys.get(s.key), keys.get(r.key)
                if ks is None or kr is None or (ks.in_sizes, ks.dtypes) == (kr.in_sizes, kr.dtypes):
                    continue
                kind = "size" if ks.in_sizes != kr.in_sizes else "dtype"
                found = MismatchFinding(kind, g, r.seq, [pair[0], pair[1]], kr, ks, True, p2p=True)
                if best is None or s.t_ns < best[0]:
                    best = (s.t_ns, found)
                break
    return best[1] if best else None


def _mismatch(
    g: Group, seq: int, votes: dict[int, int], keys: dict[int, KeyInfo], pending: bool
) -> MismatchFinding:
    fewer = None
    if len(g.members) > len(g.tracks) and len(set(votes.values())) > 1:  # members left no dump
        fewer = {
            k: -n for k in set(votes.values()) if k in keys and (n := _elements(keys[k].in_sizes)) is not None
        }
    expected, odd = _majority(votes, _group_key_counts(g), fewer)
    found = votes[odd[0]]
    exp_info = keys.get(expected, KeyInfo("?", "?", "?", "?"))
    found_info = keys.get(found, KeyInfo("?", "?", "?", "?"))
    return MismatchFinding(_mismatch_kind(exp_info, found_info), g, seq, odd, exp_info, found_info, pending)


def history_mismatch(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> MismatchFinding | None:
    """The earliest collective whose members passed different ops/sizes/dtypes, across all groups."""
    best: MismatchFinding | None = None
    for g in groups.values():
        tracks = sorted(g.tracks.items())
        if len(tracks) < 2:
            continue
        _, ref = tracks[0]
        ref_keys = memoryview(ref.keys).cast("I")
        for _rank, t in tracks[1:]:
            lo = max(ref.first_seq, t.first_seq)
            hi = min(ref.first_seq + len(ref_keys), t.first_seq + len(t.keys) // 4)
            if hi <= lo:
                continue
            a = ref.keys[4 * (lo - ref.first_seq) : 4 * (hi - ref.first_seq)]
            b = t.keys[4 * (lo - t.first_seq) : 4 * (hi - t.first_seq)]
            if a == b:
                continue
            # keys are 0 where a rank keyed no entry (older completed ones, see KEY_WINDOW): up to the later
            # of the two first keyed collectives one side is 0, so only what follows can differ (one
            # C-level comparison instead of a loop per collective)
            start = max(len(a) - len(a.lstrip(b"\0")), len(b) - len(b.lstrip(b"\0"))) // 4
            if a[4 * start :] == b[4 * start :]:
                continue
            av, bv = memoryview(a).cast("I"), memoryview(b).cast("I")
            for i in range(start, hi - lo):
                if av[i] != bv[i] and av[i] and bv[i]:
                    seq = lo + i
                    if best is None or seq < best.seq or best.group is not g:
                        votes = {r: k for r, tr in g.tracks.items() if (k := key_at(tr, seq))}
                        found = _mismatch(g, seq, votes, keys, pending=False)
                        if best is None or _earlier(found, best):
                            best = found
                    break
    return best


def _earlier(a: MismatchFinding, b: MismatchFinding) -> bool:
    ta = min((time_at(t, a.seq) for t in a.group.tracks.values()), default=0)
    tb = min((time_at(t, b.seq) for t in b.group.tracks.values()), default=0)
    return ta < tb


def _key_json(k: KeyInfo) -> dict[str, Any]:
    return {"op": k.op, "input_sizes": k.in_sizes, "output_sizes": k.out_sizes, "dtypes": k.dtypes}

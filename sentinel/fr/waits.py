"""Who waits on whom: the ranks blocked in a collective or a send/recv, and the ranks they wait for.

The waits feed :func:`sentinel.fr.waitgraph.find_culprits`, which follows them across groups to the
root cause.
"""

from __future__ import annotations

from bisect import bisect_left

from sentinel.fr.membership import Group, key_at, time_at
from sentinel.fr.ops import is_send, op_name
from sentinel.fr.rank_summary import P2P_LOG, KeyInfo, Pending
from sentinel.fr.waitgraph import Wait


def find_waits(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> list[Wait]:
    waits: list[Wait] = []
    for g in groups.values():
        absent_at: dict[int, frozenset[int]] = {}  # seq -> members that never entered it
        for rank, t in g.tracks.items():
            if t.enq <= t.done:
                continue
            seq = t.done + 1
            pend = next((p for p in t.pending if p.seq == seq and not p.p2p), None)
            if pend is not None:
                op, t_ns = op_name(pend.op), pend.t_ns
            else:  # pg_status says enqueued, the entry itself left the buffer or was not recorded
                info = keys.get(key_at(t, seq))
                op, t_ns = (info.op if info else "?"), time_at(t, seq)
            waiting_for = absent_at.get(seq)
            if waiting_for is None:
                waiting_for = absent_at[seq] = frozenset(
                    m for m in g.members if (other := g.tracks.get(m)) is None or other.enq < seq
                )
            waits.append(Wait(rank, g.name, seq, op, t_ns, waiting_for, g.desc))
    waits.extend(_p2p_waits(groups))
    return waits


def _p2p_waits(groups: dict[str, Group]) -> list[Wait]:
    """Ranks blocked in a send/recv whose peer never posted the matching recv/send.

    Point-to-point ops between a pair of ranks of one group are matched in order (the n-th send from a to
    b is the n-th recv at b from a: what NCCL and gloo deliver, and how PyTorch's analyzer pairs them).
    Ring buffers wrap, so the n is counted from an anchor both ranks share: the pending op's rank's latest
    collective before it in a group both belong to (:func:`_posted`). A pending op whose counterpart was
    posted waits for nobody (in progress, held by its batch, or stalled in the transport); one whose
    counterpart was not waits for that peer. The peer in ``profiling_name`` (``nccl:send 0->1``,
    ``nccl:recv 1<-0``) is group-local: the i-th member of the group in rank order. Backends that record
    no p2p entries (gloo) give no waits."""
    waits: list[Wait] = []
    logs: dict[tuple[int, str], list[tuple[int, int]]] = {}
    member_of: dict[int, list[Group]] = {}  # rank -> the groups its dump has a track in, in groups' order
    for g in groups.values():
        pend: dict[int, list[Pending]] = {}
        for r, t in g.tracks.items():
            if t.pending:  # (most tracks hold nothing pending: no sort, no generator for them)
                ps = sorted((p for p in t.pending if p.p2p and p.peer >= 0), key=lambda p: (p.seq, p.t_ns))
                if ps:
                    pend[r] = ps
        if not pend:
            continue
        if not member_of:  # once, and only for dumps with pending p2p ops
            for other in groups.values():
                for r in other.tracks:
                    member_of.setdefault(r, []).append(other)
        order = sorted(g.members)
        local = {r: i for i, r in enumerate(order)}
        for rank, ops in sorted(pend.items()):
            unmatched: list[tuple[Pending, int]] = []
            seen: dict[tuple[int, bool], int] = {}
            for p in ops:
                if p.peer >= len(order):
                    continue
                peer = order[p.peer]
                send = is_send(p.op)
                k = seen[(peer, send)] = seen.get((peer, send), 0) + 1
                posted = _posted(rank, peer, p, send=send, g=g, member_of=member_of, local=local, cache=logs)
                if posted is None:  # no shared anchor: count the peer's pending counterparts
                    theirs = pend.get(peer, [])
                    posted = k <= sum(
                        1 for x in theirs if x.peer == local.get(rank, -1) and is_send(x.op) != send
                    )
                if not posted:
                    unmatched.append((p, peer))
            if unmatched:
                p = unmatched[0][0]
                peers = frozenset(q for _, q in unmatched)
            else:
                p, peers = ops[0], frozenset()
            waits.append(Wait(rank, g.name, p.seq, op_name(p.op), p.t_ns, peers, g.desc, p2p=True))
    return waits


def _p2p_ops(
    rank: int, g: Group, cache: dict[tuple[int, str], list[tuple[int, int]]]
) -> list[tuple[int, int]]:
    """The rank's logged send/recv ops in ``g``: (time_created_ns, direction << 32 | local peer)."""
    key = (rank, g.name)
    ops = cache.get(key)
    if ops is None:
        t = g.tracks.get(rank)
        log = memoryview(t.p2p_log).cast("q").tolist() if t is not None else []
        ops = cache[key] = list(zip(log[::2], log[1::2], strict=True))
    return ops


def _posted(
    rank: int,
    peer: int,
    p: Pending,
    *,
    send: bool,
    g: Group,
    member_of: dict[int, list[Group]],
    local: dict[int, int],
    cache: dict[tuple[int, str], list[tuple[int, int]]],
) -> bool | None:
    """Whether ``peer`` posted the counterpart of ``rank``'s pending op ``p`` (None: cannot tell).

    Anchor: ``rank``'s latest collective created before ``p`` in a group both ranks belong to, present in
    both dumps. Counting from it, ``p`` is the n-th op of its kind from ``rank`` to ``peer``; the peer
    posted its counterpart when it ran at least n complementary ops toward ``rank`` after its own entry of
    the same collective — completed or not (a batch holds a completed transfer's entry open). Only the
    groups ``rank`` has a track in are looked at (``member_of``): a pass over every group per pending op
    is quadratic in a pipeline job whose thousands of ranks each wait in a send/recv."""
    anchor_me = anchor_peer = 0
    for other in member_of.get(rank, ()):
        mine, theirs = other.tracks.get(rank), other.tracks.get(peer)
        if mine is None or theirs is None or not mine.times:
            continue
        times = memoryview(mine.times).cast("q")
        i = bisect_left(times, p.t_ns) - 1
        while i >= 0 and not times[i]:
            i -= 1
        if i < 0 or times[i] <= anchor_me:
            continue
        at = time_at(theirs, mine.first_seq + i)
        if at:
            anchor_me, anchor_peer = times[i], at
    if not anchor_me:
        return None
    code = (0 if send else 1) << 32 | local.get(peer, -1) & 0xFFFFFFFF
    back = (1 if send else 0) << 32 | local.get(rank, -1) & 0xFFFFFFFF
    mine_ops = _p2p_ops(rank, g, cache)
    if len(mine_ops) >= P2P_LOG and mine_ops[0][0] > anchor_me:
        return None  # the log does not reach back to the anchor
    n = sum(1 for t, c in mine_ops if c == code and anchor_me < t <= p.t_ns)
    return sum(1 for t, c in _p2p_ops(peer, g, cache) if c == back and t > anchor_peer) >= n

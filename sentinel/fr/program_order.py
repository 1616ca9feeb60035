"""Which op a culprit awaited in several places never ran, read from its own earlier steps.

Training loops repeat: what a rank ran after an earlier occurrence of its last op is what it runs next,
so its own history, not the op holding most ranks, says which wait it causes first.
"""

from __future__ import annotations

from sentinel.fr.membership import Group, time_at
from sentinel.fr.rank_summary import GroupTrack
from sentinel.fr.waitgraph import Culprit, Wait
from sentinel.fr.wording import counterpart

#: Newest collectives per group, and culprits, whose program order is worked out.
ORDER_HISTORY = 128


MAX_ORDERED_CULPRITS = 32


#: Ops before the last one compared to find where in its loop the rank stopped.
ORDER_CONTEXT = 8


_Sig = tuple[str, str, int]  # (group, "c" collective | "send" | "recv", match key | group-local peer)


def _timeline(tracks: list[tuple[Group, GroupTrack]]) -> list[tuple[int, _Sig]]:
    """A rank's recent ops across all its groups (``tracks``: its track of each, in the order of the
    groups) in its own program order (its own creation times)."""
    out: list[tuple[int, _Sig]] = []
    for g, t in tracks:
        times = memoryview(t.times).cast("q")
        keys = memoryview(t.keys).cast("I")
        for i in range(max(0, len(times) - ORDER_HISTORY), len(times)):
            if times[i]:
                out.append((times[i], (g.name, "c", keys[i] if i < len(keys) else 0)))
        log = memoryview(t.p2p_log).cast("q")
        for i in range(0, len(log) - 1, 2):
            code = log[i + 1]
            out.append((log[i], (g.name, "send" if code >> 32 == 0 else "recv", code & 0xFFFFFFFF)))
    out.sort()
    return out


def _candidate_sig(w: Wait, groups: dict[str, Group]) -> tuple[str, str, int]:
    """What the culprit would run to release ``w``: the group's next collective, or the send/recv
    matching ``w``'s recv/send toward the waiting rank (its group-local number)."""
    if not w.p2p:
        return (w.group, "c", -1)
    order = sorted(groups[w.group].members)
    return (w.group, counterpart(w.op), order.index(w.rank) if w.rank in order else -1)


def _own_next(
    tracks: list[tuple[Group, GroupTrack]], candidates: dict[tuple[str, str, int], Wait]
) -> Wait | None:
    """Which of the ops others wait for ``rank`` to run comes next in the rank's *own* program.

    The rank's dump ends with its last op L. Training loops repeat: the rank ran L before, in an earlier
    step, and what it ran after that occurrence is what it runs next. Walking forward from the earlier
    occurrence of L (same group, same op and sizes) preceded by the same ops as this one (up to
    :data:`ORDER_CONTEXT`), the first op that is one of the candidates is the one the rank would reach
    first. Ranks of one job may run different programs (pipeline
    stages, subgroups of different shapes): only the rank's own history is used. None when the history
    holds no earlier L or no candidate after it. ``tracks``: the rank's track of each of its groups."""
    line = _timeline(tracks)
    if len(line) < 2:
        return None
    last = line[-1][1]

    def loose(sig: _Sig) -> _Sig:
        return (sig[0], "c", -1) if sig[1] == "c" else sig

    # the earlier occurrence whose preceding ops match the rank's most recent ones longest (most recent on
    # a tie): a step may run the same collective twice (two world all_reduces of one size), and only the
    # ops before it say which of the two the rank just ran
    best, best_len = -1, 0
    end = len(line) - 1
    for j in range(end - 1, -1, -1):
        if line[j][1] != last:
            continue
        n = 1
        while n < ORDER_CONTEXT and j - n >= 0 and line[j - n][1] == line[end - n][1]:
            n += 1
        if n > best_len:
            best, best_len = j, n
            if n == ORDER_CONTEXT:
                break
    for k in range(best + 1, len(line)) if best >= 0 else ():
        w = candidates.get(loose(line[k][1]))
        if w is not None:
            return w
    return None


def apply_program_order(
    culprits: list[Culprit], waits: list[Wait], groups: dict[str, Group]
) -> dict[int, str]:
    """For each culprit awaited in more than one place, take the op it never ran from its own program
    order (:func:`_own_next`) instead of the one that holds the most ranks; rank -> the evidence line."""
    notes: dict[int, str] = {}
    # waits of one collective share one waiting_for set: thousands of ranks waiting for thousands of
    # others are a few sets, never their product. The send/recv waits of one p2p seq are one per waiting
    # rank, each released by a different op of the culprit (the recv matching rank 0's send, the send
    # matching rank 2's recv): kept apart, or the one posted first (timing) stood for both and the
    # culprit's program order never chose between them
    ordered = [c for c in culprits[:MAX_ORDERED_CULPRITS] if c.kind == "missing" and len(c.ranks) == 1]
    if not ordered:
        return notes
    by_set: dict[tuple[frozenset[int], str, int, bool, int], Wait] = {}
    for w in sorted(waits, key=lambda w: (w.t_ns, w.rank)):
        by_set.setdefault((w.waiting_for, w.group, w.seq, w.p2p, w.rank if w.p2p else -1), w)
    # each culprit's waits of by_set (in its order), in one pass over it: a pass per culprit was 32 passes
    # over the ~4,000 sets of a 16,384-rank hang
    awaited: dict[int, list[Wait]] = {c.ranks[0]: [] for c in ordered}
    for key, cand in by_set.items():
        fs = key[0]
        for r in fs if len(fs) < len(awaited) else awaited:
            if r in fs and r in awaited:
                awaited[r].append(cand)
    chosen: list[tuple[Culprit, dict[tuple[str, str, int], Wait]]] = []
    for c in ordered:
        candidates: dict[tuple[str, str, int], Wait] = {}
        for cand in awaited[c.ranks[0]]:
            sig = _candidate_sig(cand, groups)
            if sig not in candidates or (cand.t_ns, cand.rank) < (
                candidates[sig].t_ns,
                candidates[sig].rank,
            ):
                candidates[sig] = cand
        if len(candidates) >= 2:
            chosen.append((c, candidates))
    # the tracks of the ranks whose program order is read, in the order of the groups: one pass over the
    # groups (12,289 of them at 16,384 ranks), not one per culprit
    own: dict[int, list[tuple[Group, GroupTrack]]] = {c.ranks[0]: [] for c, _ in chosen}
    for g in groups.values():
        tracks = g.tracks
        for r in tracks if len(tracks) < len(own) else own:
            t = tracks.get(r)
            if t is not None and r in own:
                own[r].append((g, t))
    for c, candidates in chosen:
        rank = c.ranks[0]
        if own[rank]:
            nxt = _own_next(own[rank], candidates)
            note = (
                f"rank {rank}'s own program order (its earlier steps in its dump): after its last op it runs "
                f"{_what_releases(nxt, groups)} next, which it never did"
                if nxt is not None
                else ""
            )
        else:
            nxt, surrogate = _surrogate_next(rank, c, candidates, groups)
            note = (
                f"rank {rank} left no dump; rank {surrogate}, which runs the same groups, ran "
                f"{_what_releases(nxt, groups)} first of the collectives rank {rank} is awaited in: its next op"
                if nxt is not None
                else ""
            )
        if nxt is None:
            continue
        c.first_wait = nxt
        notes[rank] = note
    return notes


def _surrogate_next(
    rank: int, c: Culprit, candidates: dict[tuple[str, str, int], Wait], groups: dict[str, Group]
) -> tuple[Wait | None, int]:
    """For a culprit without a dump: the awaited collective that a rank running the same kinds of groups
    (same descriptions: the same program) ran first, at the same seqs. Collective candidates only, each
    in a described group; (None, -1) when no rank with a dump runs all of them."""
    if any(sig[1] != "c" for sig in candidates) or any(not groups[w.group].desc for w in candidates.values()):
        return None, -1
    descs = {groups[w.group].desc for w in candidates.values()}
    by_desc: dict[int, dict[str, GroupTrack]] = {}
    for g in groups.values():
        if g.desc in descs:
            for r, t in g.tracks.items():
                by_desc.setdefault(r, {})[g.desc] = t
    for other in sorted(by_desc, key=lambda r: (r not in c.victims, r)):
        tracks = by_desc[other]
        if len(tracks) < len(descs):
            continue
        times = {
            sig: time_at(tracks[groups[w.group].desc], w.seq) or 1 << 63 for sig, w in candidates.items()
        }
        first = min(times, key=lambda sig: times[sig])
        if times[first] < 1 << 63 and sorted(times.values())[1] > times[first]:
            return candidates[first], other
    return None, -1


def _what_releases(w: Wait, groups: dict[str, Group]) -> str:
    g = groups[w.group]
    if w.p2p:
        return f"the {counterpart(w.op)} matching rank {w.rank}'s {w.op} (p2p #{w.seq}) in group {g.label()}"
    return f"{w.op} #{w.seq} of group {g.label()}"

"""Dumps taken at different moments: ranks whose absence the dumps themselves prove is not a hang.

On-demand dumps of a running job are snapshots a collective or so apart; a rank one collective short of
its peers is innocent when a peer's dump or the group's own timing shows the dumps came too early for any
stall threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from sentinel.fr.lateness import TIMING_WINDOW, first_after, time_columns, times_by_rank
from sentinel.fr.membership import Group, time_at
from sentinel.fr.waitgraph import Culprit, Wait
from sentinel.fr.wording import who


def stale_ranks(groups: dict[str, Group], last_t: dict[int, int]) -> dict[int, tuple[str, int, int]]:
    """Ranks whose dump is provably older than a peer's: rank -> (group, seq, witness rank).

    A collective completes only after every member entered it. When member A completed (group, s) and
    then created newer entries, while member B's dump never entered s, B's dump was taken before B
    entered s: the dumps are snapshots of a running job taken at different moments, and B's "absence"
    is not a hang. (A collective that fails also counts as completed under gloo; a rank that failed
    stops, so it creates no newer entry and is no witness.) Linear: one witness per group.
    """
    out: dict[int, tuple[str, int, int]] = {}
    for g in groups.values():
        if len(g.tracks) < 2:
            continue
        witness, best = max(g.tracks.items(), key=lambda rt: (rt[1].done, -rt[0]))
        if best.done < 0:
            continue
        newest = last_t.get(witness, 0)
        for r, t in g.tracks.items():
            if r in out or t.enq >= best.done:
                continue
            seq = t.enq + 1
            at = time_at(best, seq)
            if at == 0 or newest > at:  # (an entry gone from the ring buffer is long past)
                out[r] = (g.name, seq, witness)
    return out


#: Groups of more members than this do not serve as the in-progress witness of :func:`within_skew` (the
#: check reads every member's entries for each of its collectives).
MAX_SETTLE_MEMBERS = 1024


def within_skew(  # noqa: PLR0917 - one caller
    culprits: list[Culprit],
    groups: dict[str, Group],
    stale: dict[int, tuple[str, int, int]],
    last_t: dict[int, int],
    missing: list[int],
    in_progress: Sequence[Wait] = (),
) -> dict[int, str]:
    """Culprits whose absence the dumps' own skew explains: rank -> the finding that says why.

    A stale rank A (:func:`stale_ranks`) proves more than its own innocence: its dump was taken before
    it entered (group, s), which its witness W completed, so before W's next entry after s — call that
    moment X. Every dump follows the trigger, so the trigger came before X. A dump set triggered by a
    stall behind a culprit C comes at least the stall threshold after C's last entry t_C: X - t_C
    exceeds it. When X - t_C is no longer than the longest pause between two of C's own collectives in
    its dump — a pause its peers sat through without any watchdog firing — no stall threshold fits: C
    was running when the dumps were taken, one collective short of its peers like any rank of a running
    job dumped at slightly different moments (an on-demand dump). Only one-rank culprits that left a
    dump, whose every wait is for the collective right after their last one, are judged.

    A collective that every member of its group entered and some member was still inside when dumped
    (``in_progress``: the waits of ``all_in`` culprits; a judged culprit among its members completed it)
    bounds the moment too, when it is not stalled itself: the members inside were dumped before they
    completed it, at most its last arrival plus the longest its group's earlier collectives took from
    their last arrival to the next entry of one of those members (:func:`_longest_settle`) — so the
    trigger came before that. Without it, a running job dumped on demand with no provably stale dump reads as a hang
    (``ondemand_in_progress_n32``, ``ondemand_bcast_n24``).
    """
    if (not stale and not in_progress) or not culprits:
        return {}
    judged = [c for c in culprits if c.kind == "missing" and len(c.ranks) == 1 and c.ranks[0] not in missing]
    if not judged:
        return {}
    culprit_ranks = {c.ranks[0] for c in judged}
    # distinct in-progress collectives (one wait per member inside was given) that every judged culprit
    # among their members completed: those did not stall them
    witnesses = {
        (w.group, w.seq): w
        for w in in_progress
        if len(groups[w.group].tracks) <= MAX_SETTLE_MEMBERS
        and all(
            c in groups[w.group].tracks and groups[w.group].tracks[c].done >= w.seq
            for c in culprit_ranks & groups[w.group].members
        )
    }
    needed = {w for _, _, w in stale.values()} | culprit_ranks
    for name, _ in witnesses:
        needed |= set(groups[name].tracks)
    times_of = times_by_rank(groups, needed)
    bound, by = 0, ""
    for a, (gname, seq, witness) in sorted(stale.items()):
        at = time_at(groups[gname].tracks[witness], seq)
        after = first_after(times_of[witness], at)
        if at and after and (not bound or after < bound):
            bound, by = after, f"rank {a}'s dump predates a collective its peer completed"
    for w in witnesses.values():
        g = groups[w.group]
        arrivals = [time_at(t, w.seq) for t in g.tracks.values()]
        inside = [m for m, t in g.tracks.items() if t.done < w.seq]
        settle = _longest_settle(g, w.seq, times_of, inside)
        if arrivals and all(arrivals) and inside and settle is not None:
            at = max(arrivals) + settle
            if not bound or at < bound:
                whose = "their dumps" if len(inside) == len(g.tracks) else f"the dumps of {who(inside)}"
                bound, by = (
                    at,
                    (
                        f"{w.op} #{w.seq} of group {g.label()}, which all its members entered, was in progress "
                        f"in {whose}: taken at most {settle / 1e6:.1f} ms after its last arrival, the longest "
                        "its earlier collectives took to their next"
                    ),
                )
    if not bound:
        return {}
    out: dict[int, str] = {}
    for c in judged:
        r = c.ranks[0]
        w = c.first_wait
        track = groups[w.group].tracks.get(r)
        times = times_of[r]
        if w.p2p or track is None or track.enq != w.seq - 1 or len(times) < 2:
            continue
        pause = max(b - a for a, b in pairwise(times))
        silent = bound - last_t.get(r, times[-1])
        if silent <= pause:
            out[r] = (
                f"rank {r} is one collective short of its peers in {w.op} #{w.seq} of group "
                f"{groups[w.group].label()}, but the dumps were taken at most {max(silent, 0) / 1e6:.1f} ms "
                f"after its last entry ({by}), no longer than its own longest pause between collectives "
                f"({pause / 1e6:.1f} ms): no stall threshold fits, it was running (skewed snapshots, not a hang)"
            )
    return out


def _longest_settle(g: Group, seq: int, times_of: dict[int, list[int]], inside: Sequence[int]) -> int | None:
    """The longest any collective of ``g`` before ``seq`` (the newest :data:`TIMING_WINDOW` every member
    recorded) took from its last member's arrival to the first entry, in any group, that one of the
    members ``inside`` ``seq`` made after that arrival (ns): a member enters nothing before the collective
    it is inside completes, so this is at least as long as the first of them took to complete. The dumps
    were all triggered before any of those members completed ``seq`` (each was dumped inside it): only
    their completions bound the trigger, not those of members that had completed it when dumped (a
    broadcast's root returns long before its last receiver). ``times_of``: the members' entry times,
    sorted (:func:`times_by_rank`). None without one such collective."""
    if not g.tracks or len(g.tracks) < len(g.members):
        return None
    members = list(g.tracks)
    cols = time_columns([g.tracks[m] for m in members], TIMING_WINDOW, before=seq)
    if cols is None:
        return None
    longest = None
    for row in zip(*cols, strict=True):
        if not all(row):
            continue
        last = max(row)
        after = [first_after(times_of.get(m, []), last) for m in inside]
        if all(after):  # each of them entered something after it (0: nothing)
            gap = min(after) - last
            longest = gap if longest is None else max(longest, gap)
    return longest

"""Stragglers: ranks that enter their collectives late, and lateness carried from another rank.

Each rank's lag on a collective is its creation time minus the other members' median; a straggler is
late by a robust margin on more collectives than chance allows (a sign test), and a rank late only
because it waited for a straggler in its previous collective is named as behind it instead.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import pairwise
from struct import Struct

from sentinel.fr.membership import Group
from sentinel.fr.rank_summary import GroupTrack
from sentinel.fr.records import NamedTuple
from sentinel.stats import median, median_of_sorted, median_without

#: A straggler is late by at least this much (median over its collectives) ...
MIN_STRAGGLER_LAG_MS = 5.0


#: ... and by this factor more than the other ranks' median lateness ...
STRAGGLER_FACTOR = 3.0


#: ... on more of its collectives than a rank on time would be by chance: a one-sided sign test at this
#: level (see :func:`_late_evidence`).
STRAGGLER_SIGNIFICANCE = 0.01


#: ... measured on at least this many collectives (one late collective is noise, not a straggler).
MIN_STRAGGLER_SAMPLES = 8


#: Collectives per group used for the timing analysis (the most recent ones).
TIMING_WINDOW = 64


class Straggler(NamedTuple):
    rank: int
    lag_ms_median: float
    late_fraction: float
    n_collectives: int
    #: (the rank it waited for, on how many of its collectives, its own lag median in ms) when this rank's
    #: lateness is carried out of collectives another rank arrived in last (see :func:`_carried`); None
    #: for a straggler
    behind: tuple[int, int, float] | None = None
    #: the group whose collectives alone the figures are of (its label); "" when they are of all the
    #: rank's collectives (see :func:`_late_evidence`)
    group: str = ""


def find_stragglers(groups: dict[str, Group]) -> list[Straggler]:
    by_group: dict[int, list[tuple[str, list[float]]]] = {}  # each rank's lags, group by group
    for g in groups.values():
        tracks = [(r, t) for r, t in g.tracks.items() if t.times]
        if len(tracks) < 2 or len(tracks) < len(g.members):
            continue
        # big groups give every member many samples per collective: fewer collectives suffice
        window = max(TIMING_WINDOW // 4, min(TIMING_WINDOW, TIMING_WINDOW * 256 // len(tracks)))
        # column form: every step a C-level operation (a Python loop per sample would cost seconds at
        # thousands of ranks)
        cols = time_columns([t for _, t in tracks], window)
        if cols is None:  # the members' ring buffers do not overlap: no collective to compare
            continue
        label = g.label()
        for (r, _), lag in zip(tracks, _group_lags(cols), strict=True):
            if lag:
                by_group.setdefault(r, []).append((label, lag))
    lags = {r: [x for _, lag in v for x in lag] for r, v in by_group.items()}  # ... over all its groups
    if len(lags) < 2:
        return []
    medians = {r: median(v) for r, v in lags.items()}
    # how late the other ranks typically are; a straggler's partners look early by as much as it is
    # late, so only lateness counts (a spread that included them would hide the straggler)
    lateness = sorted(max(m, 0.0) for m in medians.values())
    out = []
    for r, m in medians.items():
        late = _late_evidence(lags[r], by_group[r])
        if late is None:
            continue
        others = median_without(lateness, bisect_left(lateness, max(m, 0.0)))
        if late.lag_ms_median > STRAGGLER_FACTOR * others:
            out.append(late._replace(rank=r))
    out.sort(key=lambda s: -s.lag_ms_median)
    return _carried(out, groups) if len(out) > 1 else out


#: Above this many collectives the sign test's binomial tail is taken from the normal approximation (within a
#: count of the exact one; the exact tail grows with the count, and is cached by count).
EXACT_SIGN_TEST_MAX = 1024


@functools.lru_cache(maxsize=1024)
def _min_late(n: int, tests: int = 1) -> int:
    """The fewest late collectives of ``n`` that a rank on time reaches with a chance of at most
    :data:`STRAGGLER_SIGNIFICANCE` / ``tests``. On time, a rank's lag against its peers' median is as
    likely below zero as above, so the count of its lags at or above any positive threshold is at most
    Binomial(n, 1/2)."""
    if n > EXACT_SIGN_TEST_MAX:
        from statistics import NormalDist  # only here: an import that small sets never need

        z = NormalDist().inv_cdf(1 - STRAGGLER_SIGNIFICANCE / tests)
        return math.ceil(n / 2 + z * math.sqrt(n) / 2 + 0.5)
    budget = (2**n * round(STRAGGLER_SIGNIFICANCE * 10**6)) // (10**6 * tests)  # exact: integers throughout
    tail = term = 1  # C(n, n)
    for k in range(n - 1, -1, -1):
        if tail > budget:
            return k + 2
        term = term * (k + 1) // (n - k)  # C(n, k) from C(n, k + 1)
        tail += term
    return 0 if tail <= budget else 1


def _late_evidence(pooled: list[float], by_group: list[tuple[str, list[float]]]) -> Straggler | None:
    """A rank's lateness as a straggler's (its ``rank`` left 0 for the caller), or None: over all its
    collectives or over those of one of its groups (the figures of whichever has it most late), it is
    late by at least :data:`MIN_STRAGGLER_LAG_MS` in the median, on at least
    :data:`MIN_STRAGGLER_SAMPLES` collectives, and by half that on more of them than chance gives a rank
    on time (a one-sided sign test).

    Half or more late is not enough: jitter makes about half of any rank's lags positive, and a loaded machine
    whose collectives take long to return gives every rank lag medians of several ms on somewhat more
    than half its collectives (``straggler_noise_n48``) — noise a fixed fraction would call stragglers. A
    straggler is late on nearly all of them. One group
    suffices because a group whose peers arrive later still, carrying a worse straggler's lateness out of
    their other groups, hides a lesser straggler there: late in its tensor-parallel group on every step, it
    is early to its data-parallel partner who waited for the worst one, and late on only half of all its
    collectives. The tests share the significance level (Bonferroni), so more groups add no false alarms.
    """
    candidates = [("", pooled), *by_group] if len(by_group) > 1 else [("", pooled)]
    best: Straggler | None = None
    for group, lag in candidates:
        n = len(lag)
        if n < MIN_STRAGGLER_SAMPLES:
            continue
        ordered = sorted(lag)  # the count of late ones and the median from one sort, in C
        late = n - bisect_left(ordered, MIN_STRAGGLER_LAG_MS / 2)
        if late < _min_late(n, len(candidates)):
            continue
        lag_median = median_of_sorted(ordered)
        if lag_median >= MIN_STRAGGLER_LAG_MS and (best is None or lag_median > best.lag_ms_median):
            best = Straggler(0, lag_median, late / n, n, group=group)
    return best


#: At most this many straggler candidates after the most late are checked for lateness carried out of
#: another rank's collective (each check reads the candidate's entries and its previous collectives').
MAX_CARRIED_CHECKS = 64


def _carried(found: list[Straggler], groups: dict[str, Group]) -> list[Straggler]:
    """Mark the ranks whose lateness is another rank's (``behind``); ``found`` is most late first.

    A collective completes only once its last member arrives, and a rank enters its next collective after
    the previous one returns: a rank that waited for a late member leaves late, and enters its next
    collectives — in its other groups, where that member may not be — as late as it waited. A straggler's
    data-parallel partner looks like a lesser straggler to its own tensor-parallel peers, and so does a
    rank that a broadcast reaches through the straggler. What a rank cannot have lost of its own is the
    time before its previous collective released it — after its last member arrived, and no later than
    the first entry any of its members made after that: of each lag, only the part after that release —
    when it came after it — is the rank's (:func:`_own_lags`). Lateness in one group alone must come from
    collectives the rank did not wait into: what is left of a cut lag is the collective's relay and the
    machine's scheduling as much as the rank (a receiver far down a broadcast's tree leaves it later than
    the member first out, and many ranks on few cores wait for a core), systematic enough over one
    group's dozen collectives to pass for a straggler there. A rank no longer late by the
    straggler rule on what is its own is named as waiting behind the rank it waited for most often. A rank
    slow of its own loses its slowness after every arrival and stays a straggler, whoever arrived last;
    the most late rank is never marked (someone is the reason the others wait)."""
    out = [found[0]]
    before = _Before(groups, {b.rank for b in found[1 : MAX_CARRIED_CHECKS + 1]})
    for b in found[1 : MAX_CARRIED_CHECKS + 1]:
        own, uncarried, waited_for = _own_lags(b.rank, groups, before)
        if not own or not waited_for:
            out.append(b)
            continue
        pooled = [x for lag in own for x in lag]
        if _late_evidence(pooled, uncarried) is not None:
            out.append(b)
            continue
        slow, n = waited_for.most_common(1)[0]
        out.append(b._replace(n_collectives=len(pooled), behind=(slow, n, median(pooled))))
    out.extend(found[MAX_CARRIED_CHECKS + 1 :])
    return out


#: Collectives of groups larger than this are not read for when they released their members (that reads
#: each member's entries): the lateness carried out of them is measured from their last arrival.
MAX_RELEASE_MEMBERS = 64


class _Before:
    """When the collectives before a straggler candidate's had their last member arrive, and when they
    released their members; read on demand and kept across the candidates :func:`_carried` checks.

    A candidate's previous collective is in one of its own groups, so the entry times a release needs are
    those of the members of the candidates' groups (of at most :data:`MAX_RELEASE_MEMBERS`): read once,
    in one pass over the groups, the newest as many per group as :func:`_last_arrivals` reads."""

    __slots__ = ("arrivals", "groups", "releases", "times")

    def __init__(self, groups: dict[str, Group], candidates: AbstractSet[int]) -> None:
        self.groups = groups
        self.arrivals: dict[str, dict[int, tuple[int, int]]] = {}
        self.releases: dict[str, dict[int, int]] = {}
        members: set[int] = set()
        for g in groups.values():
            if len(g.tracks) <= MAX_RELEASE_MEMBERS and not candidates.isdisjoint(g.tracks):
                members.update(g.tracks)
        self.times = times_by_rank(groups, members, newest=4 * TIMING_WINDOW)

    def last_arrival(self, group: str, seq: int) -> tuple[int, int] | None:
        """(time, rank) of the last member to create ``group``'s ``seq``, if every member recorded it."""
        return self._arrivals(group).get(seq)

    def _arrivals(self, group: str) -> dict[int, tuple[int, int]]:
        if group not in self.arrivals:
            self.arrivals[group] = _last_arrivals(self.groups[group])
        return self.arrivals[group]

    def release(self, group: str, seq: int) -> int:
        """The first entry, in any group, that a member of ``group`` made after the last member arrived
        in its ``seq``: no member leaves a collective before it completes, so it completed by then (ns; 0
        when unknown, or the group has more than :data:`MAX_RELEASE_MEMBERS` members)."""
        if group not in self.releases:
            g = self.groups[group]
            out: dict[int, int] = {}
            if len(g.tracks) <= MAX_RELEASE_MEMBERS:
                for k, (last, _) in self._arrivals(group).items():
                    after = [t for m in g.tracks if (t := first_after(self.times.get(m, []), last))]
                    if after:
                        out[k] = min(after)
            self.releases[group] = out
        return self.releases[group].get(seq, 0)


def _own_lags(
    rank: int, groups: dict[str, Group], before: _Before
) -> tuple[list[list[float]], list[tuple[str, list[float]]], Counter[int]]:
    """``rank``'s lags (ms) over the collectives :func:`find_stragglers` measured, group by group, each less
    the part it spent in its previous collective (in any group) waiting for that one's last member, another
    rank: at most the time from that collective's release (:meth:`_Before.release`; else its last arrival)
    to its own entry. The same lags with each one so cut counted as on time (0: for the tests of one group
    alone, see :func:`_carried`), and how many lags each such last member cut."""
    mine = [g for g in groups.values() if rank in g.tracks and g.tracks[rank].times]
    entries: list[tuple[int, str, int]] = []  # its program order: (time, group, seq), oldest first
    for g in mine:
        t = g.tracks[rank]
        entries.extend(
            (ts, g.name, t.first_seq + i)
            for i, ts in enumerate(Struct(f"<{len(t.times) // 8}q").unpack_from(t.times))
            if ts
        )
    entries.sort()
    previous = {(e[1], e[2]): p for p, e in pairwise(entries)}
    own: list[list[float]] = []
    uncarried: list[tuple[str, list[float]]] = []
    waited_for: Counter[int] = Counter()
    for g in mine:
        tracks = [(r, t) for r, t in g.tracks.items() if t.times]
        if len(tracks) < 2 or len(tracks) < len(g.members):
            continue
        window = max(TIMING_WINDOW // 4, min(TIMING_WINDOW, TIMING_WINDOW * 256 // len(tracks)))
        span = _window([t for _, t in tracks], window)
        if span is None:
            continue
        cols = time_columns([t for _, t in tracks], window)
        assert cols is not None  # the same span
        i = next(k for k, (r, _) in enumerate(tracks) if r == rank)
        mine_col = cols[i]
        seqs = [span[0] + k for k, row in enumerate(zip(*cols, strict=True)) if all(row)]
        here: list[float] = []
        kept: list[float] = []
        for seq, lag in zip(seqs, _group_lags(cols)[i], strict=True):
            p = previous.get((g.name, seq))
            last = None if p is None else before.last_arrival(p[1], p[2])
            at = mine_col[seq - span[0]]
            if last is not None and last[1] != rank and last[0] <= at:
                start = min(max(before.release(p[1], p[2]) if p else 0, last[0]), at)
                if (at - start) / 1e6 < lag:
                    waited_for[last[1]] += 1
                    here.append((at - start) / 1e6)
                    kept.append(0.0)
                    continue
            here.append(lag)
            kept.append(lag)
        if here:
            own.append(here)
            uncarried.append((g.label(), kept))
    return own, uncarried, waited_for


#: :func:`_last_arrivals` reads at most about this many creation times per group (a row per collective).
MAX_ARRIVAL_CELLS = 1 << 18


def _last_arrivals(g: Group) -> dict[int, tuple[int, int]]:
    """seq -> (time, rank) of the last member to create it, over the group's newest collectives that every
    member recorded: four timing windows of them, fewer in groups so large that would read more than
    :data:`MAX_ARRIVAL_CELLS` times (one C-level max per collective)."""
    members = list(g.tracks)
    if len(members) < 2 or len(members) < len(g.members):
        return {}
    rows = min(4 * TIMING_WINDOW, max(TIMING_WINDOW // 4, MAX_ARRIVAL_CELLS // len(members)))
    tracks = [g.tracks[m] for m in members]
    span = _window(tracks, rows)
    cols = time_columns(tracks, rows)
    if span is None or cols is None:
        return {}
    out = {}
    for k, row in enumerate(zip(*cols, strict=True)):
        if all(row):
            last = max(row)
            out[span[0] + k] = (last, members[row.index(last)])
    return out


def time_columns(
    tracks: Sequence[GroupTrack], window: int, before: int | None = None
) -> list[tuple[int, ...]] | None:
    """Each track's creation times (ns, 0: none) over the newest ``window`` collectives of the group that
    every one of them recorded (only those before seq ``before``, when given), one tuple per track, each
    read in one C call; None when they share none."""
    span = _window(tracks, window, before)
    if span is None:
        return None
    lo, hi = span
    unpack = Struct(f"{hi - lo}q").unpack_from
    return [unpack(t.times, 8 * (lo - t.first_seq)) for t in tracks]


def _window(tracks: Sequence[GroupTrack], window: int, before: int | None = None) -> tuple[int, int] | None:
    """The seqs ``[lo, hi)`` :func:`time_columns` reads; None when the tracks share none."""
    lo = max(t.first_seq for t in tracks)
    hi = min(t.first_seq + len(t.times) // 8 for t in tracks)
    if before is not None:
        hi = min(hi, before)
    lo = max(lo, hi - window)
    return None if hi <= lo else (lo, hi)


def _group_lags(cols: Sequence[Sequence[int]]) -> list[list[float]]:
    """Per member, its lag (ms) on every collective all members have a time for: its own time minus the
    median of the *other* members' (a late rank in a group of two is late against its peer)."""
    m = len(cols)
    if m == 2:
        a, b = cols
        ab = [(x - y) / 1e6 for x, y in zip(a, b, strict=True) if x and y]
        return [ab, [-v for v in ab]]
    rows = list(zip(*cols, strict=True))
    ok = [all(row) for row in rows]
    every = all(ok)  # the usual case: no member lacks a time, each column is used as it is
    kept = rows if every else [r for r, good in zip(rows, ok, strict=True) if good]
    orders = [sorted(row) for row in kept]
    h = (m - 1) // 2
    mids = [o[h] for o in orders]
    out = []
    if m % 2 == 0:  # an odd number of peers: the others' median is one order statistic
        below = [o[h + 1] for o in orders]
        for col in cols:
            own = col if every else [tv for tv, good in zip(col, ok, strict=True) if good]
            out.append(
                [(tv - (bl if tv <= md else md)) / 1e6 for tv, md, bl in zip(own, mids, below, strict=True)]
            )
        return out
    # an even number of peers: the mean of the two middle others, worked out once per side of the middle
    lows = [o[h - 1] for o in orders]
    a_s = [(o[h] + o[h + 1]) / 2 for o in orders]
    b_s = [(o[h - 1] + o[h + 1]) / 2 for o in orders]
    c_s = [(o[h - 1] + o[h]) / 2 for o in orders]
    for col in cols:
        own = col if every else [tv for tv, good in zip(col, ok, strict=True) if good]
        out.append(
            [
                (tv - (a if tv <= low else b if tv <= md else c)) / 1e6
                for tv, low, md, a, b, c in zip(own, lows, mids, a_s, b_s, c_s, strict=True)
            ]
        )
    return out


def times_by_rank(
    groups: dict[str, Group], ranks: set[int], newest: int | None = None
) -> dict[int, list[int]]:
    """When each of ``ranks`` created each collective its dump holds (the ``newest`` of each group's, when
    given), over all its groups, oldest first: one pass over the groups (a set intersection with each
    group's tracks costs the smaller of the two), so the work stays linear in the tracks however many ranks
    are asked for."""
    out: dict[int, list[int]] = {r: [] for r in ranks}
    for g in groups.values():
        for r in ranks.intersection(g.tracks):
            t = g.tracks[r]
            n = len(t.times) // 8
            keep = n if newest is None else min(n, newest)
            if keep:
                out[r].extend(Struct(f"<{keep}q").unpack_from(t.times, 8 * (n - keep)))
    return {r: sorted(x for x in times if x) for r, times in out.items()}


def first_after(times: list[int], t: int) -> int:
    """The first of the sorted ``times`` after ``t``; 0 when none is."""
    i = bisect_right(times, t)
    return times[i] if i < len(times) else 0

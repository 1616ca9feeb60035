"""Cross-rank post-mortem analysis of Flight Recorder dumps: who stalls the job, and why.

Input: one :class:`~sentinel.fr.summary.RankSummary` per rank that left a dump. The analysis

1. infers each process group's members from the entries (``pg_config`` is empty under gloo), completing
   them with ranks that have no dump when the world size or an all_gather's shape says a member is missing;
2. finds, per group, the ranks blocked in a collective and the members that never entered it, and follows
   those waits across groups to the sinks (:mod:`sentinel.fr.waitgraph`), so a cascade names its root;
3. compares what every member passed to the same (group, seq): op, sizes (per-op rules), dtypes;
4. measures per (group, seq) how late each rank created its entry against the members' median, and flags
   ranks late on most collectives by a robust margin (median / MAD across ranks);
5. turns all of it into one verdict with the evidence.

Pure: no I/O, no clock.
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

from sentinel.fr.aside import Aside, run_aside
from sentinel.fr.ops import UNRECORDED_P2P_BACKENDS, is_send, op_name
from sentinel.fr.records import TYPE_CHECKING, NamedTuple
from sentinel.fr.summary import P2P_LOG, GroupTrack, KeyInfo, Pending, RankSummary
from sentinel.fr.waitgraph import Culprit, Wait, find_culprits

if TYPE_CHECKING:
    from typing import Any

VERDICTS = ("healthy", "hang", "mismatch", "crash", "straggler", "inconclusive")

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
#: Most findings printed; the JSON carries the same cap.
MAX_FINDINGS = 40


class Group:
    """A process group as seen across all dumps."""

    __slots__ = ("desc", "members", "name", "size_hint", "tracks", "unknown_members")

    def __init__(self, name: str, desc: str, tracks: dict[int, GroupTrack], members: set[int]) -> None:
        self.name = name
        self.desc = desc
        self.tracks = tracks
        self.members = members
        self.size_hint = 0
        self.unknown_members = 0

    def label(self) -> str:
        return f"{self.name} ({self.desc})" if self.desc else self.name


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


class FrAnalysis:
    """The result of :func:`analyze`; :meth:`to_json` is the contract's ``--json`` object."""

    __slots__ = (
        "collective",
        "culprit_ranks",
        "entries",
        "findings",
        "groups",
        "mismatch",
        "missing_dumps",
        "ranks_with_dumps",
        "stragglers",
        "summary",
        "verdict",
        "versions",
        "world_size",
    )

    def __init__(
        self,
        verdict: str,
        summary: str,
        *,
        missing_dumps: list[int] | None = None,
        stragglers: list[Straggler] | None = None,
        ranks_with_dumps: int = 0,
        world_size: int = 0,
        versions: list[str] | None = None,
        entries: int = 0,
        groups: list[dict[str, Any]] | None = None,
    ) -> None:
        self.verdict = verdict
        self.summary = summary
        self.culprit_ranks: list[int] = []
        self.collective: dict[str, Any] | None = None
        self.mismatch: dict[str, Any] | None = None
        self.missing_dumps: list[int] = [] if missing_dumps is None else missing_dumps
        self.stragglers: list[Straggler] = [] if stragglers is None else stragglers
        self.findings: list[str] = []
        self.ranks_with_dumps = ranks_with_dumps
        self.world_size = world_size
        self.versions: list[str] = [] if versions is None else versions
        self.entries = entries
        self.groups: list[dict[str, Any]] = [] if groups is None else groups

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "culprit_ranks": self.culprit_ranks,
            "collective": self.collective,
            "mismatch": self.mismatch,
            "missing_dumps": self.missing_dumps,
            "stragglers": [
                {
                    "rank": s.rank,
                    "lag_ms_median": round(s.lag_ms_median, 3),
                    "late_fraction": round(s.late_fraction, 3),
                    "n_collectives": s.n_collectives,
                    "group": s.group or None,
                }
                for s in self.stragglers
            ],
            "findings": self.findings,
            "ranks_with_dumps": self.ranks_with_dumps,
            "world_size": self.world_size,
            "versions": self.versions,
            "entries": self.entries,
            "groups": self.groups,
        }


#: Ranks' timing columns (one per rank and group) from which the straggler lags are worth a forked child:
#: a fork, the child's copy-on-write faults and its exit cost ~2-4 ms, the lags ~10 us per column (64 x 200:
#: 192 columns, 1.9 ms, slower aside; 512 x 220: 1,536 columns, 14.5 ms).
ASIDE_FROM_TRACKS = 1024


def analyze(summaries: Sequence[RankSummary], *, aside: bool = False) -> FrAnalysis:
    """Analyze every rank's reduced dump (at least one) and return the verdict with its evidence.

    ``aside``: the straggler lags (half the analysis of a large set) are worked out in a forked child on
    another core while this process does the rest (:mod:`sentinel.fr.aside`; single-threaded callers only:
    the CLI), when there are at least :data:`ASIDE_FROM_TRACKS` of them. The result is the same either way."""
    if not summaries:
        raise ValueError("analyze needs at least one rank's dump")
    by_rank = {s.rank: s for s in summaries}
    present = set(by_rank)
    groups = _build_groups(summaries)
    world_size = _world_size(present, groups, summaries)
    missing = sorted(set(range(world_size)) - present)
    _complete_members(groups, present, missing, world_size)
    # groups are final from here on: the stragglers can be worked out aside, where that is worth a fork
    worth = aside and sum(len(g.tracks) for g in groups.values() if len(g.tracks) > 1) >= ASIDE_FROM_TRACKS
    lags = run_aside(functools.partial(_straggler_rows, groups)) if worth else None
    try:
        return _analyze(summaries, groups, present, world_size, missing, lags)
    finally:
        if lags is not None:
            lags.close()


def _straggler_rows(
    groups: dict[str, Group],
) -> list[tuple[int, float, float, int, tuple[int, int, float] | None, str]]:
    return [
        (s.rank, s.lag_ms_median, s.late_fraction, s.n_collectives, s.behind, s.group)
        for s in _stragglers(groups)
    ]


def _analyze(  # noqa: PLR0917 - one caller
    summaries: Sequence[RankSummary],
    groups: dict[str, Group],
    present: set[int],
    world_size: int,
    missing: list[int],
    lags: Aside | None,
) -> FrAnalysis:
    keys: dict[int, KeyInfo] = {}
    for s in summaries:
        keys.update(s.keys)

    waits = _waits(groups, keys)
    culprits = find_culprits(waits)
    order_notes = _program_order(culprits, waits, groups)
    late = _stragglers(groups) if lags is None else [Straggler(*row) for row in lags.result()]
    stragglers = [s for s in late if s.behind is None]
    inherited = [s for s in late if s.behind is not None]
    frontier_mm = _frontier_mismatch(groups, waits, keys) or _p2p_mismatch(groups, keys)
    history_mm = _history_mismatch(groups, keys)

    result = FrAnalysis(
        verdict="healthy",
        summary="",
        missing_dumps=missing,
        stragglers=stragglers,
        ranks_with_dumps=len(present),
        world_size=world_size,
        versions=sorted({s.version for s in summaries}),
        entries=sum(s.n_entries for s in summaries),
        groups=[_group_json(g) for g in sorted(groups.values(), key=lambda g: _name_order(g.name))],
    )
    last_t = {s.rank: s.last_t_ns for s in summaries}
    stale = _stale_ranks(groups, last_t)
    _decide(
        result,
        stale=stale,
        last_t=last_t,
        groups=groups,
        waits=waits,
        culprits=culprits,
        frontier_mm=frontier_mm,
        history_mm=history_mm,
        stragglers=stragglers,
        missing=missing,
        keys=keys,
    )
    if result.verdict in ("hang", "crash"):
        result.findings.extend(n for r, n in order_notes.items() if r in result.culprit_ranks)
        _note_unrecorded_p2p(result, groups)
    _add_context(result, groups, waits, missing, stragglers, inherited=inherited)
    _add_durations(
        result, {s.rank: s.median_duration_ms for s in summaries if s.median_duration_ms >= 0}, stragglers
    )
    del result.findings[MAX_FINDINGS:]
    return result


# ---------------------------------------------------------------- groups and members


def _build_groups(summaries: Sequence[RankSummary]) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    config: dict[str, set[int]] = {}
    max_rank = max(s.rank for s in summaries)
    for s in summaries:
        for t in s.groups:
            g = groups.get(t.name)
            if g is None:
                g = groups[t.name] = Group(name=t.name, desc=t.desc, tracks={}, members=set())
            if not g.desc and t.desc:
                g.desc = t.desc
            g.tracks[s.rank] = t
            if t.size_hints:
                g.size_hint = max(g.size_hint, *t.size_hints)
            if t.config_ranks and t.name not in config:  # every member reports the same table
                # believed up to twice the ranks seen (see _world_size): linear in the dumps, not in a claim
                cap = 2 * (max(len(summaries), max_rank + 1))
                config[t.name] = {
                    r for start, stop in t.config_ranks[:cap] for r in range(start, min(stop, cap))
                }
    for name, g in groups.items():
        g.members = set(g.tracks) | config.get(name, set())
    return groups


def _is_world(g: Group, present: set[int]) -> bool:
    return g.desc == "default_pg" or (len(present) > 1 and set(g.tracks) == present and g.name == "0")


def _world_size(present: set[int], groups: dict[str, Group], summaries: Sequence[RankSummary]) -> int:
    """The job's world size: at least max rank + 1, more when pg_config, any group's all_gather
    shapes or a short sub-group family say ranks left no dump. Hints are believed up to twice the ranks
    seen: a hostile shape must not make the analysis enumerate millions of absent ranks."""
    seen = max(present) + 1
    cap = max(2 * seen, 2 * len(present))
    size = seen
    for s in summaries:
        if s.config_world > size:  # ranks a pg_config lists, in a named group or not (gloo's unnamed one)
            size = min(s.config_world, cap)
    for g in groups.values():
        if g.members:
            size = max(size, min(max(g.members) + 1, cap))
        # an all_gather's shapes give its group's size, and no group is larger than the world: a 2-rank
        # job whose peer died before dumping shows its size only in a sub-group's gather
        size = max(size, min(g.size_hint, cap))
    # a family of sub-groups (same description) that partitions the ranks with one group short of the
    # family's size says the world is larger than the ranks seen (the highest rank left no dump)
    families: dict[str, list[Group]] = {}
    for g in groups.values():
        if g.desc and not _is_world(g, present):
            families.setdefault(g.desc, []).append(g)
    for family in families.values():
        covered = [r for g in family for r in g.members]
        if len(family) < 2 or len(covered) != len(set(covered)) or set(covered) != present:
            continue
        fam_size = max(max(len(g.members), g.size_hint) for g in family)
        if any(len(g.members) < fam_size for g in family):
            size = max(size, min(fam_size * len(family), cap))
    return size


def _complete_members(groups: dict[str, Group], present: set[int], missing: list[int], world: int) -> None:
    """Add members that left no dump: every rank to the world group, and missing ranks to short groups."""
    for g in groups.values():
        if _is_world(g, present):
            g.members |= set(range(world))
    if not missing:
        return
    families: dict[str, list[Group]] = {}
    for g in groups.values():
        if not _is_world(g, present):
            families.setdefault(g.desc or g.name, []).append(g)
    for family in families.values():
        size = max(max(len(g.members), g.size_hint) for g in family)
        short = [g for g in family if len(g.members) < size]
        covered = set().union(*(g.members for g in family))
        candidates = [r for r in missing if r not in covered]
        for g in short:
            g.unknown_members = size - len(g.members)
        if len(short) == 1 and 0 < len(candidates) <= short[0].unknown_members:
            short[0].members |= set(candidates)
            short[0].unknown_members -= len(candidates)
        elif short and len(candidates) == len(short) and all(g.unknown_members == 1 for g in short):
            # one missing rank per short group: ranks are usually laid out in order
            for g, r in zip(sorted(short, key=lambda g: min(g.members)), sorted(candidates), strict=True):
                g.members.add(r)
                g.unknown_members = 0


# ---------------------------------------------------------------- program order

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
    return (w.group, _counterpart(w.op), order.index(w.rank) if w.rank in order else -1)


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


def _program_order(culprits: list[Culprit], waits: list[Wait], groups: dict[str, Group]) -> dict[int, str]:
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
            sig: _time_at(tracks[groups[w.group].desc], w.seq) or 1 << 63 for sig, w in candidates.items()
        }
        first = min(times, key=lambda sig: times[sig])
        if times[first] < 1 << 63 and sorted(times.values())[1] > times[first]:
            return candidates[first], other
    return None, -1


def _what_releases(w: Wait, groups: dict[str, Group]) -> str:
    g = groups[w.group]
    if w.p2p:
        return f"the {_counterpart(w.op)} matching rank {w.rank}'s {w.op} (p2p #{w.seq}) in group {g.label()}"
    return f"{w.op} #{w.seq} of group {g.label()}"


def _note_unrecorded_p2p(res: FrAnalysis, groups: dict[str, Group]) -> None:
    """Culprits that ran point-to-point ops the backend did not record may be blocked in a send/recv for
    another culprit rather than stuck themselves: say so when the dumps cannot tell them apart."""
    unrecorded = _unrecorded_ops(groups)
    users = sorted(r for r in res.culprit_ranks if r in unrecorded)
    if not users:
        return
    per = {r: unrecorded[r] for r in users}
    res.findings.append(
        f"{_who(users)} ran operations between their collectives that left no entry ({', '.join(f'rank {r}: {n}' for r, n in per.items())}; "
        "op_id gaps: gloo counts send/recv there but does not record them): "
        + (
            "one of these culprits may be blocked in a send/recv to another rather than stuck itself; the dumps cannot say which"
            if len(res.culprit_ranks) > 1
            else "a rank blocked in an unrecorded send/recv looks like one that never entered the collective"
        )
    )


def _unrecorded_ops(groups: dict[str, Group]) -> dict[int, int]:
    """rank -> ops it ran that left no entry, over all its groups (:attr:`GroupTrack.unrecorded_ops`).

    One pass over the tracks (a pass over every group per culprit was 25 million steps, 2 s, for the
    2,048 culprits and 12,289 groups of a 16,384-rank job)."""
    unrecorded: dict[int, int] = {}
    for g in groups.values():
        for r, t in g.tracks.items():
            if t.unrecorded_ops:
                unrecorded[r] = unrecorded.get(r, 0) + t.unrecorded_ops
    return unrecorded


# ---------------------------------------------------------------- waits and mismatches


def _key_at(t: GroupTrack, seq: int) -> int:
    i = seq - t.first_seq
    if 0 <= i < len(t.keys) // 4:
        return int.from_bytes(t.keys[4 * i : 4 * i + 4], "little")
    for p in t.pending:
        if p.seq == seq and not p.p2p:
            return p.key
    return 0


def _time_at(t: GroupTrack, seq: int) -> int:
    i = seq - t.first_seq
    if 0 <= i < len(t.times) // 8:
        return int.from_bytes(t.times[8 * i : 8 * i + 8], "little", signed=True)
    return 0


def _waits(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> list[Wait]:
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
                info = keys.get(_key_at(t, seq))
                op, t_ns = (info.op if info else "?"), _time_at(t, seq)
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
        at = _time_at(theirs, mine.first_seq + i)
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


def _frontier_mismatch(
    groups: dict[str, Group], waits: list[Wait], keys: dict[int, KeyInfo]
) -> MismatchFinding | None:
    seen: set[tuple[str, int]] = set()
    for w in sorted(waits, key=lambda w: (w.t_ns, w.seq)):
        if w.p2p or (w.group, w.seq) in seen:
            continue
        seen.add((w.group, w.seq))
        g = groups[w.group]
        votes = {r: k for r, t in g.tracks.items() if t.enq >= w.seq and (k := _key_at(t, w.seq))}
        if len(set(votes.values())) > 1:
            return _mismatch(g, w.seq, votes, keys, pending=True)
    return None


def _p2p_mismatch(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> MismatchFinding | None:
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


def _history_mismatch(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> MismatchFinding | None:
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
            # C-level comparison where a loop per collective cost 4 ms at 512 ranks)
            start = max(len(a) - len(a.lstrip(b"\0")), len(b) - len(b.lstrip(b"\0"))) // 4
            if a[4 * start :] == b[4 * start :]:
                continue
            av, bv = memoryview(a).cast("I"), memoryview(b).cast("I")
            for i in range(start, hi - lo):
                if av[i] != bv[i] and av[i] and bv[i]:
                    seq = lo + i
                    if best is None or seq < best.seq or best.group is not g:
                        votes = {r: k for r, tr in g.tracks.items() if (k := _key_at(tr, seq))}
                        found = _mismatch(g, seq, votes, keys, pending=False)
                        if best is None or _earlier(found, best):
                            best = found
                    break
    return best


def _earlier(a: MismatchFinding, b: MismatchFinding) -> bool:
    ta = min((_time_at(t, a.seq) for t in a.group.tracks.values()), default=0)
    tb = min((_time_at(t, b.seq) for t in b.group.tracks.values()), default=0)
    return ta < tb


def _stale_ranks(groups: dict[str, Group], last_t: dict[int, int]) -> dict[int, tuple[str, int, int]]:
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
            at = _time_at(best, seq)
            if at == 0 or newest > at:  # (an entry gone from the ring buffer is long past)
                out[r] = (g.name, seq, witness)
    return out


# ---------------------------------------------------------------- stragglers


def _stragglers(groups: dict[str, Group]) -> list[Straggler]:
    by_group: dict[int, list[tuple[str, list[float]]]] = {}  # each rank's lags, group by group
    for g in groups.values():
        tracks = [(r, t) for r, t in g.tracks.items() if t.times]
        if len(tracks) < 2 or len(tracks) < len(g.members):
            continue
        # big groups give every member many samples per collective: fewer collectives suffice
        window = max(TIMING_WINDOW // 4, min(TIMING_WINDOW, TIMING_WINDOW * 256 // len(tracks)))
        # column form: every step a C-level operation (a Python loop per sample cost 0.2 s at 512 ranks
        # and would cost seconds at 16,384)
        cols = _time_columns([t for _, t in tracks], window)
        if cols is None:  # the members' ring buffers do not overlap: no collective to compare
            continue
        label = g.label()
        for (r, _), lag in zip(tracks, _group_lags(cols), strict=True):
            if lag:
                by_group.setdefault(r, []).append((label, lag))
    lags = {r: [x for _, lag in v for x in lag] for r, v in by_group.items()}  # ... over all its groups
    if len(lags) < 2:
        return []
    medians = {r: _median(v) for r, v in lags.items()}
    # how late the other ranks typically are; a straggler's partners look early by as much as it is
    # late, so only lateness counts (a spread that included them would hide the straggler)
    lateness = sorted(max(m, 0.0) for m in medians.values())
    out = []
    for r, m in medians.items():
        late = _late_evidence(lags[r], by_group[r])
        if late is None:
            continue
        others = _median_without(lateness, bisect_left(lateness, max(m, 0.0)))
        if late.lag_ms_median > STRAGGLER_FACTOR * others:
            out.append(late._replace(rank=r))
    out.sort(key=lambda s: -s.lag_ms_median)
    return _carried(out, groups) if len(out) > 1 else out


#: Above this many collectives the sign test's binomial tail is taken from the normal approximation (within a
#: count of the exact one; exact costs 0.15 ms at 1,000, 1.5 ms at 4,000, cached by count).
EXACT_SIGN_TEST_MAX = 1024


@functools.lru_cache(maxsize=1024)
def _min_late(n: int, tests: int = 1) -> int:
    """The fewest late collectives of ``n`` that a rank on time reaches with a chance of at most
    :data:`STRAGGLER_SIGNIFICANCE` / ``tests``. On time, a rank's lag against its peers' median is as
    likely below zero as above, so the count of its lags at or above any positive threshold is at most
    Binomial(n, 1/2)."""
    if n > EXACT_SIGN_TEST_MAX:
        from statistics import NormalDist  # only here: 20 ms of import that small sets never need

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

    Half or more late is not enough: jitter makes about half of any rank's lags positive, and a machine
    whose collectives take tens of milliseconds to return (48 gloo ranks on two cores: 100-400 ms) gives
    every rank 5-10 ms lag medians on 55-65% of 42 collectives — noise a fixed fraction would call
    stragglers. A straggler is late on nearly all of them (93-100% in every recorded set). One group
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
        median = _median_of_sorted(ordered)
        if median >= MIN_STRAGGLER_LAG_MS and (best is None or median > best.lag_ms_median):
            best = Straggler(0, median, late / n, n, group=group)
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
    the member first out, and 48 ranks on two cores wait 10-40 ms for a core), systematic enough over one
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
        out.append(b._replace(n_collectives=len(pooled), behind=(slow, n, _median(pooled))))
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
        self.times = _times_by_rank(groups, members, newest=4 * TIMING_WINDOW)

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
                    after = [t for m in g.tracks if (t := _first_after(self.times.get(m, []), last))]
                    if after:
                        out[k] = min(after)
            self.releases[group] = out
        return self.releases[group].get(seq, 0)


def _own_lags(
    rank: int, groups: dict[str, Group], before: _Before
) -> tuple[list[list[float]], list[tuple[str, list[float]]], Counter[int]]:
    """``rank``'s lags (ms) over the collectives :func:`_stragglers` measured, group by group, each less
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
        cols = _time_columns([t for _, t in tracks], window)
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
    cols = _time_columns(tracks, rows)
    if span is None or cols is None:
        return {}
    out = {}
    for k, row in enumerate(zip(*cols, strict=True)):
        if all(row):
            last = max(row)
            out[span[0] + k] = (last, members[row.index(last)])
    return out


def _time_columns(
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
    """The seqs ``[lo, hi)`` :func:`_time_columns` reads; None when the tracks share none."""
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


def _median(values: list[float]) -> float:
    """The median (``statistics`` costs 20 ms of import for this one function)."""
    return _median_of_sorted(sorted(values))


def _median_of_sorted(ordered: Sequence[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _median_without(ordered: Sequence[float], i: int) -> float:
    """Median of the sorted list ``ordered`` without its element at index ``i`` (O(1))."""
    m = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < i else ordered[k + 1]

    if m % 2:
        return float(at(m // 2))
    return (at(m // 2 - 1) + at(m // 2)) / 2


# ---------------------------------------------------------------- verdict


def _coll(g: Group, seq: int, op: str, p2p: bool = False) -> dict[str, Any]:
    """The contract's ``collective`` object; a send/recv adds ``"p2p": true`` (``seq`` is its p2p_seq_id)."""
    out: dict[str, Any] = {"pg_name": g.name, "pg_desc": g.desc, "seq": seq, "op": op}
    if p2p:
        out["p2p"] = True
    return out


def _where(w: Wait, g: Group) -> str:
    if w.p2p:
        return f"{w.op} (p2p #{w.seq}) of process group {g.label()}"
    return f"{w.op} #{w.seq} of process group {g.label()}"


def _counterpart(op: str) -> str:
    return "recv" if is_send(op) else "send"


def _ranks(ranks: Sequence[int] | AbstractSet[int]) -> str:
    items = sorted(ranks)
    if len(items) > 12:
        return ", ".join(str(r) for r in items[:10]) + f", … ({len(items)} ranks)"
    return ", ".join(str(r) for r in items)


def _who(ranks: Sequence[int] | AbstractSet[int]) -> str:
    return f"rank {_ranks(ranks)}" if len(ranks) == 1 else f"ranks {_ranks(ranks)}"


def _decide(
    res: FrAnalysis,
    *,
    groups: dict[str, Group],
    waits: list[Wait],
    culprits: list[Culprit],
    frontier_mm: MismatchFinding | None,
    history_mm: MismatchFinding | None,
    stragglers: list[Straggler],
    missing: list[int],
    stale: dict[int, tuple[str, int, int]],
    last_t: dict[int, int],
    keys: dict[int, KeyInfo],
) -> None:
    """The verdict, strongest evidence first.

    1. A mismatch at the stall, or in a collective some member never completed (it left no dump, or is
       still inside it): the mismatch caused what follows (a transport that aborts on an oversized
       message, peers that wait for the aborted rank), so it outranks the abort and the wait.
    2. Ranks missing from a collective others wait in (``missing``/``cycle`` sinks of the wait graph):
       crash when they left no dump, straggler when they are the stragglers, else hang — unless the
       dumps themselves prove that rank moved on (``stale``: a peer completed and left a collective the
       rank's dump never entered, so its dump was taken earlier: on-demand dumps of a running job) or
       that its absence is within the skew they prove (:func:`_within_skew`).
    3. Ranks only inside collectives every member entered (``all_in``): in progress when some member
       completed it or the dumps are skewed snapshots; a network/transport stall when every member started
       it (NCCL) and none completed; else inconclusive (gloo records neither start nor completion).
    """
    straggler_ranks = {s.rank for s in stragglers}
    blocked = {w.rank for w in waits}
    if frontier_mm is not None:
        _set_mismatch(res, frontier_mm, stalled=True)
        return
    if history_mm is not None and _unfinished(groups[history_mm.group.name], history_mm.seq, missing):
        _set_mismatch(res, history_mm, stalled=False)
        after = [c for c in culprits if c.kind != "all_in"]
        crashed = sorted(set(missing) & set(groups[history_mm.group.name].members))
        if crashed:
            res.findings.append(
                f"{_who(crashed)} of that group left no dump: aborted after the mismatch (e.g. a transport "
                f"that refuses an oversized message); {'it is a victim' if len(crashed) == 1 else 'they are victims'}"
            )
        for c in after[:5]:
            cw = c.first_wait
            res.findings.append(
                f"after it, {_who(sorted(c.victims or {cw.rank}))} wait in {cw.op} #{cw.seq} of group "
                f"{groups[cw.group].label()} for {_who(c.ranks)}"
            )
        return
    real = [c for c in culprits if c.kind != "all_in" and not all(r in stale for r in c.ranks)]
    disproved = [c for c in culprits if c.kind == "missing" and all(r in stale for r in c.ranks)]
    in_progress = [c.first_wait for c in culprits if c.kind == "all_in"]
    skewed = _within_skew(real, groups, stale, last_t, missing, in_progress)
    if real and len(skewed) == len(real):
        disproved, real = disproved + real, []
    if real:
        _set_culprits(
            res,
            groups=groups,
            waits=waits,
            culprits=real,
            stragglers=stragglers,
            straggler_ranks=straggler_ranks,
            missing=missing,
            blocked=blocked,
        )
        return
    if disproved:
        if stragglers:
            _set_straggler(res, stragglers, on_demand=True)
        else:
            res.verdict = "healthy"
            res.summary = (
                "healthy: the dumps were taken while the job ran (on demand); ranks are a collective or so "
                "apart, nothing is stuck"
            )
        for c in disproved[:5]:
            r = c.ranks[0]
            if r in skewed:
                res.findings.append(skewed[r])
                continue
            gname, seq, witness = stale[r]
            res.findings.append(
                f"rank {r}'s dump predates {groups[gname].label()} #{seq}, which rank {witness} completed and "
                f"moved on from: rank {r} entered it after dumping (skewed snapshots, not a hang)"
            )
        return
    if waits:
        if history_mm is not None:
            _set_mismatch(res, history_mm, stalled=False)
            return
        _judge_all_in(res, groups, waits, stragglers, stale)
        return
    if missing:
        res.verdict = "crash"
        res.culprit_ranks = list(missing)
        res.summary = f"crash: {_who(missing)} left no dump while no other rank is blocked"
        return
    if history_mm is not None:
        _set_mismatch(res, history_mm, stalled=False)
        return
    if stragglers:
        _set_straggler(res, stragglers)
        return
    users = sorted(_unrecorded_ops(groups).keys() - set(missing))
    if users:
        # gloo: every collective completed, but the ranks run send/recv it does not record; a job whose
        # ranks all wait in a send/recv (a pipeline stage that never sends) leaves exactly these dumps
        res.verdict = "inconclusive"
        res.summary = (
            f"inconclusive: every collective in the dumps completed on all members, but {_who(users)} "
            "run send/recv between their collectives that this backend does not record (op_id gaps): a job "
            "whose ranks all wait in a send/recv leaves exactly these dumps (healthy if they were taken "
            "after the run)"
        )
        res.findings.extend(_loop_position(groups, keys))
        return
    res.verdict = "healthy"
    res.summary = "healthy: every collective in the dumps completed on all members; no straggler"


def _loop_position(groups: dict[str, Group], keys: dict[int, KeyInfo]) -> list[str]:
    """Where in its loop each rank's dump ends, from its own earlier steps (gloo's ``repeat_gap``): its
    newest collective either recurs, with ops that left no entry after it before (it would run a send/recv
    next: what a pipeline blocked in send/recv leaves), or occurs nowhere earlier (a one-off, like the
    closing barrier of a finished run). Evidence for whoever reads the verdict: a job that ends after a
    recurring collective, or hangs after a one-off one, leaves the same dumps, so no verdict rests on it."""
    newest: dict[int, tuple[int, Group, GroupTrack]] = {}
    for g in groups.values():
        for r, t in g.tracks.items():
            if len(t.times) >= 8:
                at = int.from_bytes(t.times[-8:], "little", signed=True)
                if r not in newest or at > newest[r][0]:
                    newest[r] = (at, g, t)
    by_end: dict[tuple[str, int, bool], list[tuple[int, int]]] = {}
    for r, (_, g, t) in sorted(newest.items()):
        if t.repeat_gap == 0 or t.backend not in UNRECORDED_P2P_BACKENDS:  # (elsewhere -1 says nothing)
            continue
        seq = t.first_seq + len(t.times) // 8 - 1
        by_end.setdefault((g.name, seq, t.repeat_gap > 0), []).append((r, t.repeat_gap))
    out = []
    for (name, seq, recurs), found in list(by_end.items())[:3]:
        g = groups[name]
        ranks = [r for r, _ in found]
        info = keys.get(_key_at(g.tracks[ranks[0]], seq))
        what = f"{info.op if info else 'collective'} #{seq} of group {g.label()}"
        one = len(ranks) == 1
        lead = f"the dump{'' if one else 's'} of {_who(ranks)} end{'s' if one else ''} with {what}"
        if recurs:
            lo, hi = min(n for _, n in found), max(n for _, n in found)
            count = f"{lo}" if lo == hi else f"{lo}-{hi}"
            out.append(
                f"{lead}; in earlier steps the same collective was followed by {count} op(s) of that group "
                f"that left no entry (send/recv): running on, {'it' if one else 'they'} would be in one now "
                "(what a pipeline blocked in send/recv leaves)"
            )
        else:
            out.append(
                f"{lead}, which occurs nowhere earlier in {'its' if one else 'their'} "
                f"dump{'' if one else 's'}: a one-off, such as the closing barrier of a finished run"
            )
    return out


def _times_by_rank(
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


#: Groups of more members than this do not serve as the in-progress witness of :func:`_within_skew` (the
#: check reads every member's entries for each of its collectives).
MAX_SETTLE_MEMBERS = 1024


def _within_skew(  # noqa: PLR0917 - one caller
    culprits: list[Culprit],
    groups: dict[str, Group],
    stale: dict[int, tuple[str, int, int]],
    last_t: dict[int, int],
    missing: list[int],
    in_progress: Sequence[Wait] = (),
) -> dict[int, str]:
    """Culprits whose absence the dumps' own skew explains: rank -> the finding that says why.

    A stale rank A (:func:`_stale_ranks`) proves more than its own innocence: its dump was taken before
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
    trigger came before that. Without it, a running 32-rank job dumped on demand read as a hang: its
    second tensor-parallel group was inside an all_reduce that all 16 members had entered within 12 ms of
    the "culprit"'s last entry, and no dump was provably stale; and a 24-rank one, whose ranks 3 and 9
    were still receiving a world broadcast that the other 22, the "culprits" among them, had completed.
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
    times_of = _times_by_rank(groups, needed)
    bound, by = 0, ""
    for a, (gname, seq, witness) in sorted(stale.items()):
        at = _time_at(groups[gname].tracks[witness], seq)
        after = _first_after(times_of[witness], at)
        if at and after and (not bound or after < bound):
            bound, by = after, f"rank {a}'s dump predates a collective its peer completed"
    for w in witnesses.values():
        g = groups[w.group]
        arrivals = [_time_at(t, w.seq) for t in g.tracks.values()]
        inside = [m for m, t in g.tracks.items() if t.done < w.seq]
        settle = _longest_settle(g, w.seq, times_of, inside)
        if arrivals and all(arrivals) and inside and settle is not None:
            at = max(arrivals) + settle
            if not bound or at < bound:
                whose = "their dumps" if len(inside) == len(g.tracks) else f"the dumps of {_who(inside)}"
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
    sorted (:func:`_times_by_rank`). None without one such collective."""
    if not g.tracks or len(g.tracks) < len(g.members):
        return None
    members = list(g.tracks)
    cols = _time_columns([g.tracks[m] for m in members], TIMING_WINDOW, before=seq)
    if cols is None:
        return None
    longest = None
    for row in zip(*cols, strict=True):
        if not all(row):
            continue
        last = max(row)
        after = [_first_after(times_of.get(m, []), last) for m in inside]
        if all(after):  # each of them entered something after it (0: nothing)
            gap = min(after) - last
            longest = gap if longest is None else max(longest, gap)
    return longest


def _first_after(times: list[int], t: int) -> int:
    """The first of the sorted ``times`` after ``t``; 0 when none is."""
    i = bisect_right(times, t)
    return times[i] if i < len(times) else 0


def _unfinished(g: Group, seq: int, missing: list[int]) -> bool:
    """Some member of ``g`` never completed ``seq``: it left no dump, or its dump is still inside it."""
    if any(m in missing for m in g.members):
        return True
    return any(t.done < seq <= t.enq for t in g.tracks.values())


def _set_culprits(
    res: FrAnalysis,
    *,
    groups: dict[str, Group],
    waits: list[Wait],
    culprits: list[Culprit],
    stragglers: list[Straggler],
    straggler_ranks: set[int],
    missing: list[int],
    blocked: set[int],
) -> None:
    roots = [r for c in culprits for r in c.ranks]
    first = culprits[0]
    w = first.first_wait
    g = groups[w.group]
    res.culprit_ranks = list(dict.fromkeys(roots))
    res.collective = _coll(g, w.seq, w.op, w.p2p)
    victims = set().union(*(c.victims for c in culprits)) or blocked
    where = _where(w, g)
    crashed = [r for r in roots if r in missing]
    if crashed:
        res.verdict = "crash"
        res.culprit_ranks = list(dict.fromkeys(crashed + roots))
        res.summary = (
            f"crash: {_who(crashed)} left no dump and {_who(victims)} "
            f"{'waits' if len(victims) == 1 else 'wait'} for it in {where}"
        )
    elif set(first.ranks) <= straggler_ranks:
        # an on-demand dump of a running job with a slow rank looks like a stall behind that rank
        _set_straggler(res, stragglers, on_demand=True)
    elif first.cycle:
        res.verdict = "hang"
        res.summary = (
            f"hang: ranks {_ranks(first.ranks)} wait for each other in different collectives "
            f"(call-order deadlock), first in {where}"
        )
    elif w.p2p:
        res.verdict = "hang"
        res.summary = (
            f"hang: {_who(first.ranks)} never posted the {_counterpart(w.op)} that rank {w.rank} waits for in "
            f"{where}; {len(victims)} rank(s) are blocked behind it"
        )
    else:
        res.verdict = "hang"
        res.summary = (
            f"hang: {_who(first.ranks)} never entered {where}; {len(victims)} rank(s) are blocked behind it"
        )
    for c in culprits[:10]:
        cw = c.first_wait
        depend = f"; {len(c.victims)} blocked rank(s) depend on it" if c.victims else ""
        if cw.p2p:
            res.findings.append(
                f"{_who(c.ranks)} never posted the {_counterpart(cw.op)} matching rank {cw.rank}'s pending "
                f"{cw.op} (p2p #{cw.seq}) in group {groups[cw.group].label()}: the ops between a pair are "
                f"matched in order, and {'its' if len(c.ranks) == 1 else 'their'} dump holds no "
                f"{_counterpart(cw.op)} to rank {cw.rank} for it since their last common collective{depend}"
            )
            continue
        waiting = sorted(x.rank for x in waits if x.group == cw.group and x.seq == cw.seq and not x.p2p)
        verb = "waits" if len(waiting) == 1 else "wait"
        res.findings.append(
            f"{_who(c.ranks)} {'is' if len(c.ranks) == 1 else 'are'} missing from {cw.op} #{cw.seq} "
            f"of group {groups[cw.group].label()}, which {_who(waiting)} entered and {verb} in" + depend
        )
    if res.verdict == "hang" and _one_behind(groups, waits, set(roots)):
        res.findings.append(
            "the culprit is exactly one collective behind its peers: if these dumps were taken on "
            "demand while the job ran (not by a timeout), this can be ordinary skew"
        )


def _judge_all_in(
    res: FrAnalysis,
    groups: dict[str, Group],
    waits: list[Wait],
    stragglers: list[Straggler],
    stale: dict[int, tuple[str, int, int]],
) -> None:
    """Every blocked rank is inside a collective all its members entered (or a send/recv whose peer posted
    the matching op): in progress or a stall."""
    p2p = [w for w in waits if w.p2p]
    waits = [w for w in waits if not w.p2p]
    if p2p and (not waits or any(w.waiting_for - {w.rank} for w in waits)):
        # collectives wait for ranks that sit in a send/recv both sides posted: the transfer is the root
        _judge_p2p_in_flight(res, groups, p2p, stragglers)
        for w in sorted(waits, key=lambda w: (w.t_ns, w.rank))[:5]:
            if w.waiting_for - {w.rank}:
                res.findings.append(
                    f"rank {w.rank} waits in {_where(w, groups[w.group])} for {_who(w.waiting_for - {w.rank})}, "
                    f"inside the send/recv"
                )
        return
    by_coll: dict[tuple[str, int], list[Wait]] = {}
    for w in waits:
        by_coll.setdefault((w.group, w.seq), []).append(w)
    done_on: dict[tuple[str, int], list[int]] = {}
    for key in by_coll:
        g = groups[key[0]]
        done_on[key] = sorted(r for r, t in g.tracks.items() if t.done >= key[1])
    # Only collectives every member entered are judged: a rank that waits *for* a rank (a dp peer of a
    # rank still finishing its world all_reduce) is downstream of one of them and shares its fate.
    entered = {key: all(not (w.waiting_for - {w.rank}) for w in ws) for key, ws in by_coll.items()}
    stuck = [key for key in by_coll if not done_on[key] and entered[key]]
    for key, ws in sorted(by_coll.items(), key=lambda kv: min(w.t_ns for w in kv[1]))[:10]:
        g = groups[key[0]]
        if not entered[key]:
            absent = set().union(*(w.waiting_for for w in ws)) - {w.rank for w in ws}
            res.findings.append(
                f"{_who(sorted(w.rank for w in ws))} {'waits' if len(ws) == 1 else 'wait'} in {ws[0].op} "
                f"#{key[1]} of group {g.label()} for {_who(absent)}, inside other collectives themselves"
            )
        elif done_on[key]:
            res.findings.append(
                f"{ws[0].op} #{key[1]} of group {g.label()} was in progress when dumped: completed on "
                f"{_who(done_on[key])}, not yet on {_who(sorted(w.rank for w in ws))}"
            )
    if not stuck or stale:
        if stragglers:
            _set_straggler(res, stragglers, on_demand=True)
            return
        res.verdict = "healthy"
        res.summary = (
            "healthy: the last collectives were in progress when dumped (every member entered them"
            + (", some completed them" if not stuck else "; the dumps were taken while the job ran")
            + "); nothing is stuck"
        )
        if stale:
            r, (gname, seq, witness) = next(iter(sorted(stale.items())))
            res.findings.append(
                f"rank {r}'s dump predates {groups[gname].label()} #{seq}, which rank {witness} completed "
                f"and moved on from (skewed snapshots of a running job)"
            )
        return
    name, seq = min(stuck, key=lambda k: (min(w.t_ns for w in by_coll[k]), k[1]))
    g = groups[name]
    ws = by_coll[(name, seq)]
    op = ws[0].op
    res.collective = _coll(g, seq, op)
    in_it = sorted(w.rank for w in ws)
    pend = [p for t in g.tracks.values() for p in t.pending if p.seq == seq and not p.p2p]
    started = bool(pend) and all(p.state == "started" for p in pend) and len(in_it) >= len(g.tracks)
    if stragglers:
        _set_straggler(res, stragglers, on_demand=True)
    elif started:
        res.verdict = "hang"
        res.summary = (
            f"hang: every member started {op} #{seq} of group {g.label()} and none completed it: a "
            f"network/transport stall (or a device fault); no rank is missing from it"
        )
        res.findings.append(
            f"{op} #{seq} of group {g.label()}: started on all {len(pend)} members (NCCL state 'started' / "
            f"time_discovered_started_ns), completed on none (no time_discovered_completed_ns)"
        )
    else:
        res.verdict = "inconclusive"
        res.summary = (
            f"inconclusive: every member entered {op} #{seq} of group {g.label()} and none had completed it "
            f"when dumped (in progress when dumped on demand, or a network/transport stall; this backend "
            f"records neither start nor completion times)"
        )
    res.findings.append(
        f"{_who(in_it)} {'is' if len(in_it) == 1 else 'are'} inside {op} #{seq} of group {g.label()}"
    )


def _one_behind(groups: dict[str, Group], waits: list[Wait], roots: set[int]) -> bool:
    """Every wait on a root is for the collective right after the root's last one in that group."""
    for w in waits:
        if w.p2p and w.waiting_for & roots:
            return False
        for r in w.waiting_for & roots:
            t = groups[w.group].tracks.get(r)
            if t is None or t.enq != w.seq - 1:
                return False
    return True


def _set_mismatch(res: FrAnalysis, mm: MismatchFinding, stalled: bool) -> None:
    res.verdict = "mismatch"
    res.culprit_ranks = mm.ranks
    if mm.p2p:
        src, dst = mm.ranks
        res.collective = _coll(mm.group, mm.seq, "recv", p2p=True)
        res.mismatch = mm.to_json()
        what = mm.found.in_sizes if mm.kind == "size" else mm.found.dtypes
        want = mm.expected.in_sizes if mm.kind == "size" else mm.expected.dtypes
        res.summary = (
            f"mismatch: rank {src} sends {what} to rank {dst}, whose matching recv (p2p #{mm.seq} of group "
            f"{mm.group.label()}) holds {want}: neither can complete (the pair cannot say which side is wrong)"
        )
        return
    res.collective = _coll(mm.group, mm.seq, mm.found.op)
    res.mismatch = mm.to_json()
    what = {
        "op": f"called {mm.found.op} where the others call {mm.expected.op}",
        "size": f"passed sizes {mm.found.in_sizes}→{mm.found.out_sizes} where the others pass "
        f"{mm.expected.in_sizes}→{mm.expected.out_sizes}",
        "dtype": f"passed dtype {mm.found.dtypes} where the others pass {mm.expected.dtypes}",
    }[mm.kind]
    res.summary = f"mismatch: {_who(mm.ranks)} {what} in collective #{mm.seq} of group {mm.group.label()}" + (
        "; the group is stuck there" if stalled else ""
    )


def _set_straggler(res: FrAnalysis, stragglers: list[Straggler], on_demand: bool = False) -> None:
    res.verdict = "straggler"
    res.culprit_ranks = [s.rank for s in stragglers]
    res.collective = None
    s = stragglers[0]
    res.summary = (
        f"straggler: {_who(res.culprit_ranks)} {'enters' if len(res.culprit_ranks) == 1 else 'enter'} "
        f"collectives late (median {s.lag_ms_median:.1f} ms "
        f"behind its peers on {s.late_fraction:.0%} of {s.n_collectives} collectives); "
        + (
            "the ranks blocked behind it in the dump are the job waiting for it (a dump taken while the job runs)"
            if on_demand
            else "nothing is stuck"
        )
    )


def _judge_p2p_in_flight(
    res: FrAnalysis, groups: dict[str, Group], p2p: list[Wait], stragglers: list[Straggler]
) -> None:
    """Only send/recv ops are pending and each has its counterpart posted: a transfer in progress when
    dumped, or stalled in the transport when both sides started it (NCCL) and neither completed."""
    if stragglers:
        _set_straggler(res, stragglers, on_demand=True)
        return
    w = min(p2p, key=lambda w: (w.t_ns, w.seq, w.rank))
    g = groups[w.group]
    res.collective = _coll(g, w.seq, w.op, p2p=True)
    pend = [p for t in g.tracks.values() for p in t.pending if p.p2p]
    ranks = sorted({x.rank for x in p2p})
    if pend and all(p.state == "started" for p in pend):
        res.verdict = "hang"
        res.summary = (
            f"hang: {_who(ranks)} started matching send/recv ops (first {_where(w, g)}) and none completed: "
            f"a network/transport stall (or a device fault); no rank is missing from them"
        )
    else:
        res.verdict = "inconclusive"
        res.summary = (
            f"inconclusive: {_who(ranks)} posted matching send/recv ops (first {_where(w, g)}) and none had "
            f"completed when dumped (in progress when dumped on demand, or a transport stall)"
        )


def _add_context(
    res: FrAnalysis,
    groups: dict[str, Group],
    waits: list[Wait],
    missing: list[int],
    stragglers: list[Straggler],
    *,
    inherited: Sequence[Straggler] = (),
) -> None:
    if missing:
        res.findings.append(f"no dump from rank(s) {_ranks(missing)} of world size {res.world_size}")
    for s in stragglers[:10]:
        res.findings.append(
            f"rank {s.rank} creates its collectives {s.lag_ms_median:.1f} ms after its peers' median "
            f"(late on {s.late_fraction:.0%} of {s.n_collectives}"
            + (f" in group {s.group})" if s.group else ")")
        )
    for s in inherited[:10]:
        assert s.behind is not None
        slow, n, own = s.behind
        res.findings.append(
            f"rank {s.rank} is late {s.lag_ms_median:.1f} ms only behind rank {slow}: on {n} of its "
            f"{s.n_collectives} collectives it waited in the one before for rank {slow} to arrive, and "
            f"entered soon after; "
            + (f"of its own it is {own:.1f} ms late" if own > 0 else "of its own it is on time")
            + " (not a straggler)"
        )
    by_coll: dict[tuple[str, int], list[Wait]] = {}
    for w in waits:
        if w.p2p:
            continue
        by_coll.setdefault((w.group, w.seq), []).append(w)
    for w in sorted((w for w in waits if w.p2p), key=lambda w: (w.t_ns, w.rank))[:15]:
        text = f"group {groups[w.group].label()} p2p #{w.seq}: rank {w.rank} blocked in {w.op}"
        if w.waiting_for:
            text += f"; no matching {_counterpart(w.op)} posted by: {_ranks(w.waiting_for)}"
        res.findings.append(text)
    for (name, seq), ws in sorted(by_coll.items(), key=lambda kv: min(w.t_ns for w in kv[1]))[:15]:
        g = groups[name]
        absent = set().union(*(w.waiting_for for w in ws)) - {w.rank for w in ws}
        done = sorted(r for r, t in g.tracks.items() if t.done >= seq)
        text = f"group {g.label()} #{seq} {ws[0].op}: blocked {_ranks([w.rank for w in ws])}"
        if absent:
            text += f"; never entered: {_ranks(absent)}"
        if done:
            text += f"; completed (or failed) on: {_ranks(done)}"
        res.findings.append(text)
    for g in groups.values():
        if g.unknown_members:
            res.findings.append(
                f"group {g.label()} has {g.unknown_members} member(s) beyond those seen in the dumps"
            )


def _add_durations(res: FrAnalysis, durations: dict[int, float], stragglers: list[Straggler]) -> None:
    """NCCL's ``duration_ms`` corroborates a straggler: it arrives when its peers already wait, so its own
    collectives are short while theirs include the wait for it."""
    if len(durations) < 2 or not stragglers:
        return
    others = sorted(v for r, v in durations.items() if r not in {s.rank for s in stragglers})
    if not others:
        return
    typical = others[len(others) // 2]
    for s in stragglers[:5]:
        mine = durations.get(s.rank)
        if mine is not None:
            res.findings.append(
                f"rank {s.rank}'s collectives take a median {mine:.1f} ms on the device against {typical:.1f} ms "
                f"on its peers (duration_ms): they wait for it"
            )


def _group_json(g: Group) -> dict[str, Any]:
    enq = [t.enq for t in g.tracks.values()]
    done = [t.done for t in g.tracks.values()]
    return {
        "pg_name": g.name,
        "pg_desc": g.desc,
        "members": sorted(g.members) if len(g.members) <= 64 else len(g.members),
        "last_enqueued": [min(enq), max(enq)] if enq else None,
        "last_completed": [min(done), max(done)] if done else None,
    }


def _key_json(k: KeyInfo) -> dict[str, Any]:
    return {"op": k.op, "input_sizes": k.in_sizes, "output_sizes": k.out_sizes, "dtypes": k.dtypes}


def _name_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 60, name)

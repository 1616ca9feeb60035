"""The stuck detector's reading of a stalled job's live heads: which collectives stall, who never
entered them, and whose send/recv waits for a peer that never posted its counterpart.

:func:`examine_steps` walks every rank's Flight Recorder heads (sliced: it yields every
:data:`ITEMS_PER_STEP` ranks) into an :class:`Examination` — the stalled collectives, the ranks they wait
for (followed through other groups to the rank that waits for nothing: :mod:`sentinel.fr.waitgraph`) and
each culprit's evidence trail. What the examination concludes is :mod:`.stuck_causes`'s.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from sentinel.aggregator.detectors.base import ITEMS_PER_STEP, Steps, run_steps
from sentinel.aggregator.state import JobView, RankView
from sentinel.config.aggregator import StuckConfig
from sentinel.fr.heads import PgHead
from sentinel.fr.ops import UNRECORDED_P2P_BACKENDS, backend, is_send, op_name, p2p_peer
from sentinel.fr.waitgraph import Culprit, Wait, find_culprits

#: the stuck detector's name (its findings' ``detector``)
DETECTOR = "stuck"
#: share of min_wait_s that some waiting rank must have reported itself (not extrapolated by the aggregator)
OBSERVED_WAIT_FRACTION = 0.5
#: Work bound per job and tick: the oldest stalled collectives examined, and the absent members followed
#: per collective: a small heads message claiming a huge world with hundreds of in-flight seqs must not cost
#: seconds per tick, and a real stall is named by its oldest collectives and first culprits.
MAX_STALLED_EXAMINED = 8
MAX_FOLLOWED = 256
#: the probe's op for a wait it saw only in the per-group counters (no entry details yet)
UNKNOWN_OP = "unknown"
#: A stall of ranks that are *only* blocked in send/recv needs those ops (and the job's lack of collective
#: progress) to last this many of the job's steps too, when its step time is known: a pipeline stage
#: legitimately waits in a recv through the bubble of the stages before it — up to about a step in a job
#: whose collectives complete once per step — where a collective's peers wait well under a second.
P2P_STALL_STEPS = 2.0


@dataclass(slots=True)
class Stall:
    """What the detector saw in one stalled job (for metrics and incidents)."""

    job: str
    pg: str
    seq: int
    op: str
    waited_s: float
    waiting: list[int]
    culprits: list[int] = field(default_factory=list)
    fr_outcome: str | None = None  # confirmed | corrected | inconclusive, once the job's dumps are analyzed


@dataclass(slots=True)
class _Rank:
    view: RankView
    fresh: bool
    offset: float
    pgs: dict[str, PgHead]
    waits: list[tuple[str, int, str, float]]  # (pg, seq, op, age now)
    p2p: list[tuple[str, int, str, float, int, bool]] = field(default_factory=list)
    # (pg, p2p seq, op, age now, global peer, is a send) of each pending send/recv with a known peer
    unconfirmed: list[tuple[str, int, str, float, int, bool]] = field(default_factory=list)
    # the same of each one the probe reported unconfirmed (maybe a completed one-op batch's member): never
    # a wait; only counted as a counterpart its peer may have been sent (_p2p_edges)


def _ranks_summary(ranks: Collection[int], limit: int = 8) -> str:
    first = heapq.nsmallest(limit, ranks)  # linear: a claimed world of 131,072 ranks is not sorted per line
    text = ",".join(str(r) for r in first)
    return f"{text},… ({len(ranks)} ranks)" if len(ranks) > limit else text


Trail = list[Callable[[float], str]]  # evidence lines rendered at the time they are reported


@dataclass(slots=True)
class Examination:
    """What one stalled job's rank heads say, kept while they say the same.

    Examining a job walks every rank's heads (a 24,576-rank job: tenths of a second of a core); concluding
    from it (culprits' hosts, GPUs, I/O state, network evidence, the waits' ages now) is cheap and is done
    every tick. The examination depends on the heads only through their progress (``progress_version``),
    each rank's freshness and the waits' ages crossing ``min_wait_s``; it is :meth:`valid` until one of those
    can have changed, so its conclusions are those a fresh examination would reach.
    """

    at: float
    progress_at: float
    version: int
    ranks: dict[int, _Rank]
    #: ranks whose heads were stale (or whose process was gone) at ``at``: new heads from one can revive it
    stale: list[int]
    #: every fresh rank stays fresh until then at least (their oldest heads + heads_fresh_s)
    fresh_until: float
    #: the first moment a wait not yet counted reaches ``min_wait_s`` (``at``: a wait only extrapolated)
    until: float
    #: stalled collectives: (pg, seq) → (op, when the longest waiter entered it, the waiting ranks)
    stalled: dict[tuple[str, int], tuple[str, float, list[int]]] = field(default_factory=dict)
    first: tuple[str, int] | None = None
    culprits: dict[int, tuple[str, Trail]] = field(default_factory=dict)
    all_in: list[tuple[str, int]] = field(default_factory=list)
    #: the ranks wait in collectives of a backend whose send/recv never show in the heads (gloo): a rank
    #: that "never entered" may be blocked in one
    blind_p2p: bool = False
    #: no collective stalled but ranks blocked in send/recv for min_wait_s: (rank, pg, p2p seq, op, since,
    #: peer) of each one's oldest such op, oldest first (``first`` and ``stalled`` then name the oldest)
    p2p_only: list[tuple[int, str, int, str, float, int]] = field(default_factory=list)

    def valid(self, job: JobView, cfg: StuckConfig, now: float) -> bool:
        """Whether examining the heads again at ``now`` would find the same (cheap: the stale ranks, and
        every rank's freshness only once the oldest fresh heads near their limit)."""
        if self.version != job.progress_version or self.progress_at != job.last_progress_at:
            return False
        if now >= self.until:
            return False
        ranks = job.ranks
        for rank in self.stale:
            view = ranks.get(rank)
            if view is None or view.heads_at > self.at:
                return False
        if now > self.fresh_until:  # some heads may be stale now: look at the fresh ranks' newest
            oldest = min((info.view.heads_at for info in self.ranks.values() if info.fresh), default=math.inf)
            if now - oldest > cfg.heads_fresh_s:
                return False
            self.fresh_until = oldest + cfg.heads_fresh_s
        return True


def examine(job: JobView, cfg: StuckConfig, now: float) -> Examination | None:
    """Examine ``job``'s rank heads: its stalled collectives and the ranks they wait for; None when no rank
    sent heads (the watchdog's timeouts are then all there is)."""
    return run_steps(examine_steps(job, cfg, now))


def examine_steps(job: JobView, cfg: StuckConfig, now: float) -> Steps[Examination | None]:
    """:func:`examine`, yielding every :data:`ITEMS_PER_STEP` ranks of each pass over them.

    Between steps batches may be applied: the ranks are walked from a copy, each rank's heads are read
    once, and the examination carries the job's progress as it was when it began, so progress made
    meanwhile makes it invalid at the next tick (examined again) rather than judged from mixed heads."""
    version, progress_at = job.progress_version, job.last_progress_at
    ranks: dict[int, _Rank] = {}
    stale: list[int] = []
    oldest_fresh = math.inf
    p2p_min = max(cfg.min_wait_s, P2P_STALL_STEPS * job.step_s) if job.step_s else cfg.min_wait_s
    ordered: dict[int, list[int]] = {}  # id(a group's shared ranks list) → its ranks sorted
    for walked, view in enumerate(list(job.ranks.values())):
        if walked % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
            yield
        heads = view.heads
        if heads is None:
            continue
        since = now - view.heads_at
        fresh = since <= cfg.heads_fresh_s and view.alive
        if fresh:
            oldest_fresh = min(oldest_fresh, view.heads_at)
        else:
            stale.append(view.rank)
        offset = since if fresh else 0.0
        pgs: dict[str, PgHead] = {}
        waits: list[tuple[str, int, str, float]] = []
        p2p: list[tuple[str, int, str, float, int, bool]] = []
        unconfirmed: list[tuple[str, int, str, float, int, bool]] = []
        for pg in heads.pgs:
            pgs[pg.pg_name] = pg
            for flight in pg.in_flight:
                if flight.p2p:
                    # a send/recv's seq is its p2p_seq_id, not a collective's: read as a collective wait
                    # it made every rank "missing" from a collective nobody reached; it is an edge to its
                    # peer instead (below). One the probe could not yet confirm as pending (the member of a
                    # completed one-op batch reads alike) is no wait at all, whatever its age: counted, a
                    # site's lower min_wait_s named a completed batch stuck
                    peer = _p2p_peer(pg, flight.op, ordered)
                    if peer is not None:
                        flights = unconfirmed if flight.unconfirmed else p2p
                        flights.append((pg.pg_name, flight.seq, flight.op, flight.age_s + offset, *peer))
                    continue
                if not flight.unconfirmed:  # (the probe marks only send/recv)
                    waits.append((pg.pg_name, flight.seq, flight.op, flight.age_s + offset))
        ranks[view.rank] = _Rank(view, fresh, offset, pgs, waits, p2p, unconfirmed)
    if not ranks:
        return None
    # (the first wait of each rank suffices: one job, one backend; stops at the first gloo one)
    blind_p2p = any(
        backend(w[0][2]) in UNRECORDED_P2P_BACKENDS for info in ranks.values() if (w := info.waits)
    )
    exam = Examination(
        at=now,
        progress_at=progress_at,
        version=version,
        ranks=ranks,
        stale=stale,
        fresh_until=oldest_fresh + cfg.heads_fresh_s,
        until=math.inf,
        blind_p2p=blind_p2p,
    )

    members: dict[str, set[int]] = {}
    world_pgs: set[str] = set()
    for walked, (rank, info) in enumerate(ranks.items()):
        if walked % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
            yield
        for name, pg in info.pgs.items():
            group = members.setdefault(name, set())
            group.add(rank)
            if pg.ranks:
                if len(group) < len(pg.ranks):
                    group.update(pg.ranks)
            elif pg.pg_desc == "default_pg":
                world_pgs.add(name)
    if job.world_size and job.world_size <= 1 << 20:
        for name in world_pgs:
            members[name].update(range(job.world_size))

    stalled: dict[tuple[str, int], tuple[str, float, list[int]]] = {}
    reported: dict[tuple[str, int], float] = {}
    p2p_held: dict[int, tuple[str, int, str, float, int]] = {}  # rank -> its oldest stalled send/recv
    for walked, (rank, info) in enumerate(ranks.items()):
        if walked % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
            yield
        if not info.fresh:
            continue
        for pg_name, seq, op, age in info.waits:
            if age >= cfg.min_wait_s:
                op0, age0, waiting = stalled.get((pg_name, seq), (op, 0.0, []))
                if op0 == UNKNOWN_OP:  # between the probe's detailed dumps a wait's op is unknown; any
                    op0 = op  # waiting rank that knows it names it
                waiting.append(rank)
                stalled[(pg_name, seq)] = (op0, max(age0, age), waiting)
                own = age - info.offset
                reported[(pg_name, seq)] = max(reported.get((pg_name, seq), 0.0), own)
            else:  # this wait becomes long enough to count then
                exam.until = min(exam.until, now + cfg.min_wait_s - age)
        for pg_name, seq, op, age, with_rank, _send in info.p2p:  # so does a send/recv's (_p2p_edges)
            if age < cfg.min_wait_s:
                exam.until = min(exam.until, now + cfg.min_wait_s - age)
            elif age - info.offset < cfg.min_wait_s * OBSERVED_WAIT_FRACTION:
                # only extrapolated (as for collectives, below): the next heads may report it
                exam.until = now
            elif age < p2p_min:  # long enough to be an edge, not yet to make a stall of send/recv alone
                exam.until = min(exam.until, now + p2p_min - age)
            else:
                held = p2p_held.get(rank)
                if held is None or age > held[3]:
                    p2p_held[rank] = (pg_name, seq, op, age, with_rank)
    # A wait only extrapolated from the last heads is not a stall: when a job ends, its ranks' last heads
    # are taken at slightly different moments (some already inside the final collective, some not) and
    # then stop; extrapolated, that looks like a stall for the second before the heads turn stale. Some
    # waiting rank must itself have reported the wait for part of min_wait_s.
    observed = {
        key: value
        for key, value in stalled.items()
        if reported[key] >= cfg.min_wait_s * OBSERVED_WAIT_FRACTION
    }
    if len(observed) < len(stalled):
        exam.until = now  # the next heads may report it: examine again
    stalled = observed
    if not stalled and now - job.last_progress_at < p2p_min:
        exam.until = min(exam.until, job.last_progress_at + p2p_min)
        p2p_held.clear()
    if not stalled and not p2p_held:
        return exam

    def not_entered(pg_name: str, seq: int) -> list[int]:
        # a set difference over the members (C speed: a claimed world of 131,072 costs milliseconds), the
        # entered side from the ranks that report heads (few)
        group = members.get(pg_name, set())
        entered = set()
        for rank, info in ranks.items():
            pg = info.pgs.get(pg_name)
            if pg is not None and pg.last_enqueued_seq >= seq:
                entered.add(rank)
        return list(group - entered)

    missing_of: dict[tuple[str, int], frozenset[int]] = {}
    summaries: dict[tuple[str, int], str] = {}

    def missing_summary(key: tuple[str, int]) -> str:
        text = summaries.get(key)
        if text is None:
            text = summaries[key] = _ranks_summary(missing(*key))
        return text

    def missing(pg_name: str, seq: int) -> frozenset[int]:
        key = (pg_name, seq)
        known = missing_of.get(key)
        if known is None:
            known = missing_of[key] = frozenset(not_entered(pg_name, seq))
        return known

    # One wait-for graph for live heads and post-mortem dumps (sentinel.fr.waitgraph): every fresh rank's
    # waits, each pointing at the members that have not entered that collective. Its sinks reachable from a
    # stalled wait are the culprits: a rank that waits for nobody, or a cycle (call-order deadlock).
    graph: list[Wait] = []
    followed: dict[tuple[str, int], tuple[list[int], set[int], frozenset[int]]] = {}
    age_of: dict[tuple[int, str, int], float] = {}
    stalled_waiters: set[int] = set()
    for walked, (rank, info) in enumerate(ranks.items()):
        if walked % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
            yield
        if not info.fresh:
            continue
        blocking: dict[
            str, tuple[int, str, float]
        ] = {}  # per group the oldest wait: the others queue behind it
        for pg_name, seq, op, age in info.waits:
            if pg_name not in blocking or seq < blocking[pg_name][0]:
                blocking[pg_name] = (seq, op, age)
            if (pg_name, seq) in stalled:
                stalled_waiters.add(rank)
        if not stalled and rank in p2p_held:
            stalled_waiters.add(rank)  # no collective stalled: the ranks blocked in send/recv are the stall
        for pg_name, (seq, op, age) in blocking.items():
            # bounded: no more than MAX_FOLLOWED of the members it waits for are followed (a claimed world of
            # 131,072 ranks must not become 131,072 edges per wait)
            entry = followed.get((pg_name, seq))
            if entry is None:
                head = heapq.nsmallest(MAX_FOLLOWED + 1, missing(pg_name, seq))
                entry = followed[(pg_name, seq)] = (head, set(head), frozenset(head[:MAX_FOLLOWED]))
            head, in_head, shared = entry
            # a waiting rank is rarely among those it waits for: then every waiter shares one set (one hub
            # in the wait-for graph, hashed once)
            targets = frozenset([m for m in head if m != rank][:MAX_FOLLOWED]) if rank in in_head else shared
            graph.append(Wait(rank, pg_name, seq, op, int((now - age) * 1e9), targets))
            age_of[(rank, pg_name, seq)] = age
    graph.extend(_p2p_edges(ranks, cfg, now))
    oldest = sorted(stalled.items(), key=lambda item: -item[1][1])[:MAX_STALLED_EXAMINED]
    if oldest:
        exam.first = oldest[0][0]
        exam.stalled = {key: (op, now - age, waiting) for key, (op, age, waiting) in stalled.items()}
        exam.all_in = [key for key, _ in oldest if not missing(*key)]
    else:
        # Every stalled rank is blocked in a send/recv (a pipeline whose stage never sent): the stall is
        # named by the oldest of those ops, and the p2p edges above lead to the rank nobody's op can
        # complete without: one that never posted the counterpart, or a cycle of them (a deadlock).
        exam.p2p_only = sorted(
            ((r, g, sq, op, now - age, peer) for r, (g, sq, op, age, peer) in p2p_held.items()),
            key=lambda x: (x[4], x[0]),
        )
        _, g0, sq0, op0, since0, _ = exam.p2p_only[0]
        exam.first = (g0, sq0)
        exam.stalled = {exam.first: (op_name(op0), since0, sorted(p2p_held))}
    culprits = exam.culprits
    yield  # the wait-for graph's culprits are found in one step (sentinel.fr.waitgraph)
    found = find_culprits(graph)
    yield
    for culprit in found:
        if culprit.kind == "all_in" or not (
            culprit.victims & stalled_waiters or culprit.first_wait.rank in stalled_waiters
        ):
            continue
        trail = (
            _p2p_trail(exam)
            if exam.p2p_only
            else _trail(culprit, stalled, oldest, age_of, now, missing, missing_summary)
        )
        for rank in culprit.ranks[:MAX_FOLLOWED]:
            reason, why = _blame(rank, culprit, ranks.get(rank), alone=bool(exam.p2p_only))
            culprits.setdefault(rank, (reason, [*trail, why]))
    return exam


def _trail(  # noqa: PLR0917
    culprit: Culprit,
    stalled: Mapping[tuple[str, int], tuple[str, float, list[int]]],
    oldest: list[tuple[tuple[str, int], tuple[str, float, list[int]]]],
    age_of: Mapping[tuple[int, str, int], float],
    now: float,
    missing: Callable[[str, int], frozenset[int]],
    missing_summary: Callable[[tuple[str, int]], str],
) -> Trail:
    """The evidence that leads from the stalled collective holding the culprit's victims to the culprit."""
    w = culprit.first_wait
    outer = next(
        (
            key
            for key, (_, _, waiting) in oldest
            if missing(*key) and (culprit.victims | {w.rank}) & set(waiting)
        ),
        (w.group, w.seq),
    )
    op0, age0, waiting0 = stalled.get(outer, (w.op, age_of.get((w.rank, w.group, w.seq), 0.0), [w.rank]))
    lead = f"{len(waiting0)} rank(s) ({_ranks_summary(waiting0)}) wait "
    tail = f"s in {op0} (pg {outer[0]}, seq {outer[1]}); not entered: {missing_summary(outer)}"
    trail: Trail = [_aged(lead, now - age0, tail)]
    if (w.group, w.seq) != outer and not culprit.cycle:
        inner = age_of.get((w.rank, w.group, w.seq), 0.0)
        trail.append(
            _aged(
                f"rank {w.rank} is itself waiting ",
                now - inner,
                f"s in {w.op} (pg {w.group}, seq {w.seq}) for rank(s) {_ranks_summary(sorted(w.waiting_for))}",
            )
        )
    return trail


def _p2p_trail(exam: Examination) -> Trail:
    """The evidence of a stall in which every stalled rank is blocked in a send/recv: the longest wait."""
    held = exam.p2p_only
    r0, g0, sq0, op0, since0, peer0 = held[0]
    lead = (
        f"{len(held)} rank(s) ({_ranks_summary([h[0] for h in held])}) are blocked in send/recv and none in a "
        f"stalled collective; the longest for "
    )
    tail = f"s: rank {r0} in {op_name(op0)} (pg {g0}, p2p #{sq0}) with rank {peer0}"
    return [_aged(lead, since0, tail)]


def _blame(
    rank: int, culprit: Culprit, known: _Rank | None, *, alone: bool
) -> tuple[str, Callable[[float], str]]:
    """The reason and the last evidence line for one culprit rank; ``alone``: every stalled rank is blocked
    in a send/recv (a cycle is then a p2p deadlock, and what the culprit itself does is said)."""
    w = culprit.first_wait
    if culprit.cycle:
        ring = _ranks_summary(list(culprit.ranks))
        if alone:
            return "deadlock", _fixed(
                f"ranks {ring} wait on each other in send/recv: each is blocked in an op whose counterpart "
                "the next one never posted (a p2p deadlock)"
            )
        return "deadlock", _fixed(
            f"ranks {ring} wait on each other in different collectives (call-order deadlock)"
        )
    if known is None:
        return "rank_gone", _fixed(f"rank {rank} has sent no flight-recorder heads")
    if not known.view.alive or not known.fresh:
        return "rank_gone", _silent_since(rank, known.view)
    if not w.p2p:
        return "not_entered_collective", _fixed(f"rank {rank} never entered (pg {w.group}, seq {w.seq})")
    other = "recv" if is_send(w.op) else "send"
    text = f"rank {rank} never posted the {other} that rank {w.rank} waits for in {w.op} (pg {w.group}, p2p #{w.seq})"
    if alone:
        if known.p2p:
            text += "; it is itself inside a send/recv its peer did post (a transfer that does not complete)"
        elif known.waits:
            text += "; it is itself inside a collective"
        elif known.unconfirmed:
            text += (
                "; it is itself in no collective, nor in a send/recv confirmed pending (idle or computing)"
            )
        else:
            text += "; it is itself in no send/recv nor collective (idle or computing)"
    return "not_entered_collective", _fixed(text)


def _p2p_peer(pg: PgHead, op: str, ordered: dict[int, list[int]]) -> tuple[int, bool] | None:
    """(global peer, is a send) of a pending ``nccl:send 0->1`` / ``nccl:recv 1<-0``; the peer in the name
    is group-local: the i-th of the group's ranks (the world's rank itself when the heads carry no list).

    ``ordered`` keeps each group's sorted ranks for one examination, keyed by the list's identity (every
    rank's heads share the job's one list per group, ``JobView.pg_ranks``): sorting a 24,576-rank
    world list for every pending send/recv of every rank would cost seconds per examination."""
    peers = p2p_peer(op)
    if peers is None:
        return None
    send = is_send(op)
    local = peers[1] if send else peers[0]
    if pg.ranks:
        members = ordered.get(id(pg.ranks))
        if members is None:
            members = ordered[id(pg.ranks)] = sorted(pg.ranks)
        return (members[local], send) if 0 <= local < len(members) else None
    return (local, send) if pg.pg_desc == "default_pg" and 0 <= local < 1 << 24 else None


def _p2p_edges(ranks: Mapping[int, _Rank], cfg: StuckConfig, now: float) -> list[Wait]:
    """A fresh rank blocked in a send/recv for at least ``min_wait_s`` waits for its peer when the peer
    posted no counterpart toward it (matched by count over the pending ops, as in the dump analysis) and is
    not itself blocked in a collective: an idle or gone peer (it never sent), or one blocked in a send/recv
    (a pipeline chain). A peer inside a collective gets no edge: heads hold no history to tell its
    counterpart from a transfer its batch still holds open, and its own wait carries the chain. The peer's
    unconfirmed send/recv count as counterparts posted: one may be pending (blamed for never posting it, the
    peer would be named falsely), and while it is unconfirmed it only withholds this edge."""
    edges: list[Wait] = []
    for rank, info in ranks.items():
        if not info.fresh:
            continue
        seen: dict[tuple[str, int, bool], int] = {}
        for pg_name, seq, op, age, peer, send in sorted(info.p2p, key=lambda f: f[1]):
            if age < cfg.min_wait_s:
                continue
            k = seen[(pg_name, peer, send)] = seen.get((pg_name, peer, send), 0) + 1
            other = ranks.get(peer)
            if other is not None and other.fresh:
                posted = sum(
                    1
                    for flights in (other.p2p, other.unconfirmed)
                    for f in flights
                    if f[0] == pg_name and f[4] == rank and f[5] != send
                )
                if posted >= k or other.waits:
                    continue
            edges.append(
                Wait(rank, pg_name, seq, op_name(op), int((now - age) * 1e9), frozenset({peer}), p2p=True)
            )
    return edges


def _aged(lead: str, since: float, tail: str) -> Callable[[float], str]:
    """An evidence line naming how long something has lasted at the time it is reported."""
    return lambda now: f"{lead}{now - since:.1f}{tail}"


def _fixed(text: str) -> Callable[[float], str]:
    return lambda _now: text


def _silent_since(rank: int, view: RankView) -> Callable[[float], str]:
    return lambda now: f"rank {rank}'s process is gone or silent (last heads {now - view.heads_at:.0f}s ago)"

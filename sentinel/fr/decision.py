"""The verdict: healthy, hang, mismatch, crash, straggler or inconclusive, strongest evidence first.

Takes the waits, culprits, mismatches, stragglers and skew worked out before and writes the verdict,
summary, culprits and the collective into :class:`~sentinel.fr.verdict.FrAnalysis`.
"""

from __future__ import annotations

from sentinel.fr.findings import unrecorded_ops_by_rank
from sentinel.fr.lateness import Straggler
from sentinel.fr.membership import Group, key_at
from sentinel.fr.mismatch import MismatchFinding
from sentinel.fr.ops import UNRECORDED_P2P_BACKENDS
from sentinel.fr.rank_summary import GroupTrack, KeyInfo
from sentinel.fr.records import TYPE_CHECKING
from sentinel.fr.skew import within_skew
from sentinel.fr.verdict import FrAnalysis
from sentinel.fr.waitgraph import Culprit, Wait
from sentinel.fr.wording import counterpart, list_ranks, who

if TYPE_CHECKING:
    from typing import Any


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


def decide(
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
       that its absence is within the skew they prove (:func:`within_skew`).
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
                f"{who(crashed)} of that group left no dump: aborted after the mismatch (e.g. a transport "
                f"that refuses an oversized message); {'it is a victim' if len(crashed) == 1 else 'they are victims'}"
            )
        for c in after[:5]:
            cw = c.first_wait
            res.findings.append(
                f"after it, {who(sorted(c.victims or {cw.rank}))} wait in {cw.op} #{cw.seq} of group "
                f"{groups[cw.group].label()} for {who(c.ranks)}"
            )
        return
    real = [c for c in culprits if c.kind != "all_in" and not all(r in stale for r in c.ranks)]
    disproved = [c for c in culprits if c.kind == "missing" and all(r in stale for r in c.ranks)]
    in_progress = [c.first_wait for c in culprits if c.kind == "all_in"]
    skewed = within_skew(real, groups, stale, last_t, missing, in_progress)
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
        res.summary = f"crash: {who(missing)} left no dump while no other rank is blocked"
        return
    if history_mm is not None:
        _set_mismatch(res, history_mm, stalled=False)
        return
    if stragglers:
        _set_straggler(res, stragglers)
        return
    users = sorted(unrecorded_ops_by_rank(groups).keys() - set(missing))
    if users:
        # gloo: every collective completed, but the ranks run send/recv it does not record; a job whose
        # ranks all wait in a send/recv (a pipeline stage that never sends) leaves exactly these dumps
        res.verdict = "inconclusive"
        res.summary = (
            f"inconclusive: every collective in the dumps completed on all members, but {who(users)} "
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
        info = keys.get(key_at(g.tracks[ranks[0]], seq))
        what = f"{info.op if info else 'collective'} #{seq} of group {g.label()}"
        one = len(ranks) == 1
        lead = f"the dump{'' if one else 's'} of {who(ranks)} end{'s' if one else ''} with {what}"
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
            f"crash: {who(crashed)} left no dump and {who(victims)} "
            f"{'waits' if len(victims) == 1 else 'wait'} for it in {where}"
        )
    elif set(first.ranks) <= straggler_ranks:
        # an on-demand dump of a running job with a slow rank looks like a stall behind that rank
        _set_straggler(res, stragglers, on_demand=True)
    elif first.cycle:
        res.verdict = "hang"
        res.summary = (
            f"hang: ranks {list_ranks(first.ranks)} wait for each other in different collectives "
            f"(call-order deadlock), first in {where}"
        )
    elif w.p2p:
        res.verdict = "hang"
        res.summary = (
            f"hang: {who(first.ranks)} never posted the {counterpart(w.op)} that rank {w.rank} waits for in "
            f"{where}; {len(victims)} rank(s) are blocked behind it"
        )
    else:
        res.verdict = "hang"
        res.summary = (
            f"hang: {who(first.ranks)} never entered {where}; {len(victims)} rank(s) are blocked behind it"
        )
    for c in culprits[:10]:
        cw = c.first_wait
        depend = f"; {len(c.victims)} blocked rank(s) depend on it" if c.victims else ""
        if cw.p2p:
            res.findings.append(
                f"{who(c.ranks)} never posted the {counterpart(cw.op)} matching rank {cw.rank}'s pending "
                f"{cw.op} (p2p #{cw.seq}) in group {groups[cw.group].label()}: the ops between a pair are "
                f"matched in order, and {'its' if len(c.ranks) == 1 else 'their'} dump holds no "
                f"{counterpart(cw.op)} to rank {cw.rank} for it since their last common collective{depend}"
            )
            continue
        waiting = sorted(x.rank for x in waits if x.group == cw.group and x.seq == cw.seq and not x.p2p)
        verb = "waits" if len(waiting) == 1 else "wait"
        res.findings.append(
            f"{who(c.ranks)} {'is' if len(c.ranks) == 1 else 'are'} missing from {cw.op} #{cw.seq} "
            f"of group {groups[cw.group].label()}, which {who(waiting)} entered and {verb} in" + depend
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
                    f"rank {w.rank} waits in {_where(w, groups[w.group])} for {who(w.waiting_for - {w.rank})}, "
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
                f"{who(sorted(w.rank for w in ws))} {'waits' if len(ws) == 1 else 'wait'} in {ws[0].op} "
                f"#{key[1]} of group {g.label()} for {who(absent)}, inside other collectives themselves"
            )
        elif done_on[key]:
            res.findings.append(
                f"{ws[0].op} #{key[1]} of group {g.label()} was in progress when dumped: completed on "
                f"{who(done_on[key])}, not yet on {who(sorted(w.rank for w in ws))}"
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
        f"{who(in_it)} {'is' if len(in_it) == 1 else 'are'} inside {op} #{seq} of group {g.label()}"
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
    res.summary = f"mismatch: {who(mm.ranks)} {what} in collective #{mm.seq} of group {mm.group.label()}" + (
        "; the group is stuck there" if stalled else ""
    )


def _set_straggler(res: FrAnalysis, stragglers: list[Straggler], on_demand: bool = False) -> None:
    res.verdict = "straggler"
    res.culprit_ranks = [s.rank for s in stragglers]
    res.collective = None
    s = stragglers[0]
    res.summary = (
        f"straggler: {who(res.culprit_ranks)} {'enters' if len(res.culprit_ranks) == 1 else 'enter'} "
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
            f"hang: {who(ranks)} started matching send/recv ops (first {_where(w, g)}) and none completed: "
            f"a network/transport stall (or a device fault); no rank is missing from them"
        )
    else:
        res.verdict = "inconclusive"
        res.summary = (
            f"inconclusive: {who(ranks)} posted matching send/recv ops (first {_where(w, g)}) and none had "
            f"completed when dumped (in progress when dumped on demand, or a transport stall)"
        )

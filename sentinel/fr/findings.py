"""Evidence lines added to a verdict: missing dumps, stragglers, blocked collectives, device durations."""

from __future__ import annotations

from collections.abc import Sequence

from sentinel.fr.lateness import Straggler
from sentinel.fr.membership import Group
from sentinel.fr.verdict import FrAnalysis
from sentinel.fr.waitgraph import Wait
from sentinel.fr.wording import counterpart, list_ranks, who


def note_unrecorded_p2p(res: FrAnalysis, groups: dict[str, Group]) -> None:
    """Culprits that ran point-to-point ops the backend did not record may be blocked in a send/recv for
    another culprit rather than stuck themselves: say so when the dumps cannot tell them apart."""
    unrecorded = unrecorded_ops_by_rank(groups)
    users = sorted(r for r in res.culprit_ranks if r in unrecorded)
    if not users:
        return
    per = {r: unrecorded[r] for r in users}
    res.findings.append(
        f"{who(users)} ran operations between their collectives that left no entry ({', '.join(f'rank {r}: {n}' for r, n in per.items())}; "
        "op_id gaps: gloo counts send/recv there but does not record them): "
        + (
            "one of these culprits may be blocked in a send/recv to another rather than stuck itself; the dumps cannot say which"
            if len(res.culprit_ranks) > 1
            else "a rank blocked in an unrecorded send/recv looks like one that never entered the collective"
        )
    )


def unrecorded_ops_by_rank(groups: dict[str, Group]) -> dict[int, int]:
    """rank -> ops it ran that left no entry, over all its groups (:attr:`GroupTrack.unrecorded_ops`).

    One pass over the tracks (a pass over every group per culprit was 25 million steps, 2 s, for the
    2,048 culprits and 12,289 groups of a 16,384-rank job)."""
    unrecorded: dict[int, int] = {}
    for g in groups.values():
        for r, t in g.tracks.items():
            if t.unrecorded_ops:
                unrecorded[r] = unrecorded.get(r, 0) + t.unrecorded_ops
    return unrecorded


def add_context(
    res: FrAnalysis,
    groups: dict[str, Group],
    waits: list[Wait],
    missing: list[int],
    stragglers: list[Straggler],
    *,
    inherited: Sequence[Straggler] = (),
) -> None:
    if missing:
        res.findings.append(f"no dump from rank(s) {list_ranks(missing)} of world size {res.world_size}")
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
            text += f"; no matching {counterpart(w.op)} posted by: {list_ranks(w.waiting_for)}"
        res.findings.append(text)
    for (name, seq), ws in sorted(by_coll.items(), key=lambda kv: min(w.t_ns for w in kv[1]))[:15]:
        g = groups[name]
        absent = set().union(*(w.waiting_for for w in ws)) - {w.rank for w in ws}
        done = sorted(r for r, t in g.tracks.items() if t.done >= seq)
        text = f"group {g.label()} #{seq} {ws[0].op}: blocked {list_ranks([w.rank for w in ws])}"
        if absent:
            text += f"; never entered: {list_ranks(absent)}"
        if done:
            text += f"; completed (or failed) on: {list_ranks(done)}"
        res.findings.append(text)
    for g in groups.values():
        if g.unknown_members:
            res.findings.append(
                f"group {g.label()} has {g.unknown_members} member(s) beyond those seen in the dumps"
            )


def add_durations(res: FrAnalysis, durations: dict[int, float], stragglers: list[Straggler]) -> None:
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

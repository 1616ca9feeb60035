"""Live stuck detection from every rank's heads: the part-A root-cause logic applied to live progress.

``find_stuck`` is what the aggregator's stuck detector calls with the latest :class:`FrHeads` of each rank
of a job. A rank whose oldest in-flight collective (group G, seq s) is older than ``min_age_s`` waits for
the members of G that never entered s (their last enqueued seq in G is below s, or they report nothing);
the waits are followed across groups to the sinks (:mod:`sentinel.fr.waitgraph`). When every member is
inside the stalled collective and none finishes, no rank is to blame: an "all_in" finding (network,
transport or device). Pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sentinel.fr.heads import FrHeads, PgHead
from sentinel.fr.ops import op_name
from sentinel.fr.waitgraph import Wait, find_culprits


@dataclass(slots=True)
class StuckFinding:
    """Why a job is stuck. ``kind``: missing_rank, deadlock or all_in."""

    kind: str
    culprit_ranks: list[int]
    pg_name: str
    pg_desc: str
    seq: int
    op: str
    waiting_ranks: list[int]
    oldest_age_s: float
    findings: list[str] = field(default_factory=list)


def find_stuck(heads_by_rank: Mapping[int, FrHeads], now: float, min_age_s: float) -> StuckFinding | None:
    """The root cause of a stall visible in the heads, or None when nothing waits longer than min_age_s."""
    members = _members(heads_by_rank)
    waits: list[Wait] = []
    ages: dict[tuple[str, int], float] = {}
    descs: dict[str, str] = {}
    for rank, heads in heads_by_rank.items():
        staleness = max(0.0, now - heads.t)
        for pg in heads.pgs:
            descs.setdefault(pg.pg_name, pg.pg_desc)
            oldest = next((f for f in pg.in_flight if not f.p2p and f.seq == pg.last_completed_seq + 1), None)
            if oldest is None:
                continue
            age = oldest.age_s + staleness
            if age < min_age_s:
                continue
            seq = oldest.seq
            waiting_for = set()
            for m in members.get(pg.pg_name, set()):
                if m == rank:
                    continue
                other = _head(heads_by_rank.get(m), pg.pg_name)
                if other is None or other.last_enqueued_seq < seq:
                    waiting_for.add(m)
            key = (pg.pg_name, seq)
            ages[key] = max(ages.get(key, 0.0), age)
            t_ns = int((now - age) * 1e9)
            waits.append(
                Wait(rank, pg.pg_name, seq, op_name(oldest.op), t_ns, frozenset(waiting_for), pg.pg_desc)
            )
    if not waits:
        return None
    # a rank inside a collective every member entered is not to blame: that collective is judged below
    culprits = [c for c in find_culprits(waits) if c.kind != "all_in"]
    if culprits:
        first = culprits[0]
        w = first.first_wait
        waiting = sorted(x.rank for x in waits if x.group == w.group and x.seq == w.seq)
        kind = "deadlock" if first.cycle else "missing_rank"
        findings = [
            f"rank(s) {', '.join(map(str, c.ranks))} never entered {c.first_wait.op} #{c.first_wait.seq} of group "
            f"{c.first_wait.group}"
            + (f" ({descs.get(c.first_wait.group)})" if descs.get(c.first_wait.group) else "")
            for c in culprits[:10]
        ]
        return StuckFinding(
            kind=kind,
            culprit_ranks=list(dict.fromkeys(r for c in culprits for r in c.ranks)),
            pg_name=w.group,
            pg_desc=w.group_desc,
            seq=w.seq,
            op=w.op,
            waiting_ranks=waiting,
            oldest_age_s=ages[(w.group, w.seq)],
            findings=findings,
        )
    w = min(waits, key=lambda x: (x.t_ns, x.seq))
    inside = sorted(x.rank for x in waits if x.group == w.group and x.seq == w.seq)
    return StuckFinding(
        kind="all_in",
        culprit_ranks=[],
        pg_name=w.group,
        pg_desc=w.group_desc,
        seq=w.seq,
        op=w.op,
        waiting_ranks=inside,
        oldest_age_s=ages[(w.group, w.seq)],
        findings=[
            f"every member entered {w.op} #{w.seq} of group {w.group} and none completed it for "
            f"{ages[(w.group, w.seq)]:.1f} s: network, transport or device fault"
        ],
    )


def _head(heads: FrHeads | None, pg_name: str) -> PgHead | None:
    if heads is None:
        return None
    return next((pg for pg in heads.pgs if pg.pg_name == pg_name), None)


def _members(heads_by_rank: Mapping[int, FrHeads]) -> dict[str, set[int]]:
    """Group members: the configured ranks when known, else every rank reporting the group; the default
    group spans the whole world."""
    members: dict[str, set[int]] = {}
    world = max((h.world_size or 0 for h in heads_by_rank.values()), default=0)
    world = max(world, max(heads_by_rank, default=-1) + 1)
    for rank, heads in heads_by_rank.items():
        for pg in heads.pgs:
            group = members.setdefault(pg.pg_name, set())
            group.add(rank)
            if pg.ranks:
                group.update(pg.ranks)
            if pg.pg_desc == "default_pg":
                group.update(range(world))
    return members

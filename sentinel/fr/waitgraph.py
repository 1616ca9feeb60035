"""Follow who-waits-for-whom across process groups to the ranks that cause a stall.

A rank blocked in collective (group G, seq s) waits for the members of G that never entered s. Those may
themselves be blocked in another group (a cascade: rank 7 of dp waits for rank 3 which ... ), so the real
culprits are the *sinks* of this wait-for graph reachable from the blocked ranks. Sinks come in three kinds
(:attr:`Culprit.kind`):

* ``missing`` — a rank that waits for nobody and is not inside any collective: hung outside collectives,
  crashed, or without a dump/heads. The rank is to blame.
* ``cycle`` — ranks that wait on each other in different collectives (call-order deadlock).
* ``all_in`` — a rank inside a collective that *every* member entered. It waits for no rank: that collective
  is in progress (a dump taken while the job runs) or stalled in the network/transport/device. The rank is
  not to blame; callers judge the collective (:attr:`Culprit.first_wait` is the rank's own wait there).

Both the post-mortem dump analysis (:mod:`sentinel.fr.analysis`) and the aggregator's live stuck detector
(:mod:`sentinel.aggregator.detectors.stuck`, on the ranks' heads) use this: one stall algorithm. The API is deliberately small and stable:

* :class:`Wait` — one blocked rank: (rank, group, seq, op, t_ns, waiting_for, group_desc);
* :func:`find_culprits` ``(waits) -> list[Culprit]`` — sinks, root cause first (earliest wait naming them);
* :class:`Culprit` — ``ranks``, ``first_wait``, ``victims``, ``kind`` (and ``cycle`` = kind == "cycle").

Pure: no I/O, no clock. Linear in the number of waits and edges (Tarjan, iterative).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class Wait:
    """Rank ``rank`` is blocked in (``group``, ``seq``) waiting for ``waiting_for`` to enter it."""

    rank: int
    group: str
    seq: int
    op: str
    t_ns: int  # when the waiting rank entered the collective (time_created_ns, or snapshot time - age)
    waiting_for: frozenset[int]
    group_desc: str = ""


CulpritKind = Literal["missing", "cycle", "all_in"]


@dataclass(slots=True)
class Culprit:
    """A root cause of a stall and the earliest collective that waits for it (see the module docstring)."""

    ranks: tuple[int, ...]  # one rank, or the members of a deadlock cycle
    first_wait: Wait
    victims: set[int] = field(default_factory=set)
    kind: CulpritKind = "missing"

    @property
    def cycle(self) -> bool:
        return self.kind == "cycle"


def find_culprits(waits: Sequence[Wait]) -> list[Culprit]:
    """The sinks of the wait-for graph, root cause first (ordered by the earliest wait naming them)."""
    edges: dict[int, set[int]] = {}
    all_in: dict[int, Wait] = {}  # rank -> its wait in a collective every member entered
    for w in waits:
        targets = edges.setdefault(w.rank, set())
        targets.update(w.waiting_for - {w.rank})
        if not w.waiting_for - {w.rank}:
            prev = all_in.get(w.rank)
            if prev is None or (w.t_ns, w.seq) < (prev.t_ns, prev.seq):
                all_in[w.rank] = w
    if not any(edges.values()):
        # nobody waits for a rank: every blocked rank is inside a collective all its members entered
        return [
            Culprit(ranks=(r,), first_wait=w, kind="all_in")
            for r, w in sorted(all_in.items(), key=lambda kv: (kv[1].t_ns, kv[1].seq, kv[0]))
        ]
    nodes = set(edges)
    for targets in edges.values():
        nodes |= targets
    comp_of = _strongly_connected(nodes, edges)
    members: dict[int, list[int]] = {}
    for node, comp in comp_of.items():
        members.setdefault(comp, []).append(node)
    sink_comps = {
        comp
        for comp, ranks in members.items()
        if all(comp_of[t] == comp for r in ranks for t in edges.get(r, ()))
        and (len(ranks) > 1 or not edges.get(ranks[0]))
    }
    first: dict[int, Wait] = {}
    for w in sorted(waits, key=lambda w: (w.t_ns, w.seq, w.rank)):
        for target in w.waiting_for:
            comp = comp_of.get(target, -1)
            if comp in sink_comps and comp not in first and comp_of.get(w.rank) != comp:
                first[comp] = w
    for comp in sink_comps - set(first):  # a pure cycle: the earliest wait inside it
        inside = [w for w in waits if comp_of.get(w.rank) == comp]
        first[comp] = min(inside, key=lambda w: (w.t_ns, w.seq, w.rank))
    victims = _victims(edges, comp_of, sink_comps)
    culprits = []
    for comp in sink_comps:
        kind = _kind(members[comp], all_in, edges)
        culprits.append(
            Culprit(
                ranks=tuple(sorted(members[comp])),
                first_wait=all_in[members[comp][0]] if kind == "all_in" else first[comp],
                victims=victims.get(comp, set()),
                kind=kind,
            )
        )
    culprits.sort(key=lambda c: (c.first_wait.t_ns, c.first_wait.seq, -len(c.victims), c.ranks))
    return culprits


def _kind(ranks: list[int], all_in: Mapping[int, Wait], edges: Mapping[int, set[int]]) -> CulpritKind:
    if len(ranks) > 1:
        return "cycle"
    return "all_in" if ranks[0] in all_in and not edges.get(ranks[0]) else "missing"


def _victims(
    edges: Mapping[int, set[int]], comp_of: Mapping[int, int], sinks: set[int]
) -> dict[int, set[int]]:
    """For each sink component, the blocked ranks from which it is reachable."""
    out: dict[int, set[int]] = {}
    for start in edges:
        seen = {start}
        stack = [start]
        while stack:
            node = stack.pop()
            comp = comp_of[node]
            if comp in sinks and node != start:
                out.setdefault(comp, set()).add(start)
            for nxt in edges.get(node, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    return out


def _strongly_connected(nodes: Iterable[int], edges: Mapping[int, set[int]]) -> dict[int, int]:
    """Tarjan's algorithm, iterative (wait graphs can span thousands of ranks)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    comp_of: dict[int, int] = {}
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[int, list[int]]] = [(root, sorted(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp_of[member] = index[node]
                    if member == node:
                        break
    return comp_of

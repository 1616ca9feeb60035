"""Follow who-waits-for-whom across process groups to the ranks that cause a stall.

A rank blocked in collective (group G, seq s) waits for the members of G that never entered s. Those may
themselves be blocked in another group (a cascade: rank 7 of dp waits for rank 3 which ... ), so the real
culprits are the *sinks* of this wait-for graph reachable from the blocked ranks: ranks that wait for
nobody (hung outside any collective, crashed, or without a dump), or a set of ranks that wait on each
other (call-order deadlock). Both the post-mortem dump analysis and the live stuck detector use this.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


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


@dataclass(slots=True)
class Culprit:
    """A root cause of a stall and the earliest collective that waits for it."""

    ranks: tuple[int, ...]  # one rank, or the members of a deadlock cycle
    first_wait: Wait
    victims: set[int] = field(default_factory=set)
    cycle: bool = False


def find_culprits(waits: Sequence[Wait]) -> list[Culprit]:
    """The sinks of the wait-for graph, root cause first (ordered by the earliest wait naming them)."""
    edges: dict[int, set[int]] = {}
    for w in waits:
        edges.setdefault(w.rank, set()).update(w.waiting_for - {w.rank})
    if not any(edges.values()):
        return []
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
    culprits = [
        Culprit(
            ranks=tuple(sorted(members[comp])),
            first_wait=first[comp],
            victims=victims.get(comp, set()),
            cycle=len(members[comp]) > 1,
        )
        for comp in sink_comps
    ]
    culprits.sort(key=lambda c: (c.first_wait.t_ns, c.first_wait.seq, -len(c.victims), c.ranks))
    return culprits


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

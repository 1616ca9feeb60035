"""Follow who-waits-for-whom across process groups to the ranks that cause a stall.

A blocked rank waits for the members that never entered its collective (or the peer that never posted a
matching send/recv); those may be blocked elsewhere, so the culprits are the sinks of this graph:
``missing`` (waits for nobody, inside nothing), ``cycle`` (a call-order deadlock) or ``all_in`` (inside a
collective every member entered: the collective is judged, not the rank). The post-mortem analysis and
the live stuck detector both use :func:`find_culprits`: one stall algorithm. Pure, linear in the waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from sentinel.fr.records import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Literal


class Wait(NamedTuple):
    """Rank ``rank`` is blocked in (``group``, ``seq``) waiting for ``waiting_for`` to enter it."""

    rank: int
    group: str
    seq: int
    op: str
    t_ns: int  # when the waiting rank entered the collective (time_created_ns, or snapshot time - age)
    waiting_for: frozenset[int]
    group_desc: str = ""
    #: a point-to-point op (``op`` is ``send``/``recv``, ``seq`` its ``p2p_seq_id``, ``waiting_for`` the peer
    #: whose matching op is not posted); collectives and p2p ops live in separate sequence spaces
    p2p: bool = False


if TYPE_CHECKING:
    CulpritKind = Literal["missing", "cycle", "all_in"]


class Culprit:
    """A root cause of a stall and the collective that waits for it: the one holding most ranks, earliest on a tie."""

    __slots__ = ("first_wait", "kind", "ranks", "victims")

    def __init__(self, ranks: tuple[int, ...], first_wait: Wait, kind: CulpritKind = "missing") -> None:
        self.ranks = ranks  # one rank, or the members of a deadlock cycle
        self.first_wait = first_wait
        self.victims: set[int] = set()
        self.kind = kind

    @property
    def cycle(self) -> bool:
        return self.kind == "cycle"


#: Culprits whose victims (blocked ranks that depend on them) are worked out; later ones get none.
MAX_VICTIM_SETS = 32


def find_culprits(waits: Sequence[Wait]) -> list[Culprit]:
    """The sinks of the wait-for graph, root cause first (ordered by the earliest wait naming them).

    Waits in one collective share their ``waiting_for`` set; each distinct set becomes one hub node
    (rank -> hub -> absent members), so thousands of ranks waiting for thousands of others cost the sum
    of the sets, not their product. Rank nodes are >= 0, hubs < 0."""
    edges: dict[int, set[int]] = {}
    all_in: dict[int, Wait] = {}  # rank -> its wait in a collective every member entered
    hub_of: dict[frozenset[int], int] = {}
    hub_waits: dict[int, list[Wait]] = {}
    for w in waits:
        targets = edges.setdefault(w.rank, set())
        wanted = w.waiting_for - {w.rank} if w.rank in w.waiting_for else w.waiting_for
        if not wanted:
            prev = all_in.get(w.rank)
            if prev is None or (w.t_ns, w.seq) < (prev.t_ns, prev.seq):
                all_in[w.rank] = w
            continue
        hub = hub_of.get(wanted)
        if hub is None:
            hub = hub_of[wanted] = -1 - len(hub_of)
            edges[hub] = set(wanted)
        targets.add(hub)
        hub_waits.setdefault(hub, []).append(w)
    if not hub_of:
        # nobody waits for a rank: every blocked rank is inside a collective all its members entered
        return [
            Culprit(ranks=(r,), first_wait=w, kind="all_in")
            for r, w in sorted(all_in.items(), key=lambda kv: (kv[1].t_ns, kv[1].seq, kv[0]))
        ]
    nodes = set(edges)
    for hub in hub_of.values():
        nodes |= edges[hub]
    comp_of = _strongly_connected(nodes, edges)
    members: dict[int, list[int]] = {}
    for node, comp in comp_of.items():
        members.setdefault(comp, []).append(node)
    sink_comps = {
        comp
        for comp, inside in members.items()
        if any(n >= 0 for n in inside)
        and all(comp_of[t] == comp for n in inside for t in edges.get(n, ()))
        and (len(inside) > 1 or not edges.get(inside[0]))
    }
    first: dict[int, Wait] = {}
    for hub, ws in sorted(hub_waits.items(), key=lambda kv: min((w.t_ns, w.seq, w.rank) for w in kv[1])):
        # The collective that holds the most ranks for it comes first, the earliest on a tie: in a cascade
        # the absent rank is also awaited downstream (a dp peer of a rank missing from its tp all_reduce),
        # by fewer ranks and, on a loaded host, sometimes a few microseconds earlier.
        held = Counter((w.group, w.seq, w.p2p) for w in ws)
        ws.sort(key=lambda w: (-held[(w.group, w.seq, w.p2p)], w.t_ns, w.seq, w.rank))
        for comp in {comp_of[t] for t in edges[hub]} & sink_comps:
            if comp not in first:
                outside = next((w for w in ws if comp_of.get(w.rank) != comp), None)
                if outside is not None:
                    first[comp] = outside
    for comp in sink_comps - set(first):  # a pure cycle: the earliest wait inside it
        inside = [w for w in waits if comp_of.get(w.rank) == comp]
        first[comp] = min(inside, key=lambda w: (w.t_ns, w.seq, w.rank))
    culprits = []
    for comp in sink_comps:
        ranks = sorted(n for n in members[comp] if n >= 0)
        kind = _kind(ranks, all_in, edges)
        culprits.append(
            Culprit(
                ranks=tuple(ranks),
                first_wait=all_in[ranks[0]] if kind == "all_in" else first[comp],
                kind=kind,
            )
        )
    culprits.sort(key=lambda c: (c.first_wait.t_ns, c.first_wait.seq, c.ranks))
    reverse = _reverse(edges)
    for c in culprits[:MAX_VICTIM_SETS]:
        c.victims = _ancestors(c.ranks, reverse)
    # equally early culprits: the one more ranks wait for first
    culprits.sort(key=lambda c: (c.first_wait.t_ns, c.first_wait.seq, -len(c.victims), c.ranks))
    return culprits


def _reverse(edges: Mapping[int, set[int]]) -> dict[int, list[int]]:
    reverse: dict[int, list[int]] = {}
    for node, targets in edges.items():
        for t in targets:
            reverse.setdefault(t, []).append(node)
    return reverse


def _ancestors(ranks: Sequence[int], reverse: Mapping[int, list[int]]) -> set[int]:
    """Blocked ranks from which one of ``ranks`` is reachable (hubs are passed through, not counted)."""
    start = set(ranks)
    seen = set(start)
    stack = list(start)
    while stack:
        node = stack.pop()
        for prev in reverse.get(node, ()):
            if prev not in seen:
                seen.add(prev)
                stack.append(prev)
    return {n for n in seen - start if n >= 0}


def _kind(ranks: list[int], all_in: Mapping[int, Wait], edges: Mapping[int, set[int]]) -> CulpritKind:
    if len(ranks) > 1:
        return "cycle"
    return "all_in" if ranks[0] in all_in and not edges.get(ranks[0]) else "missing"


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

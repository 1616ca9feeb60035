"""What the demo shows at one moment: the cluster as the aggregator sees it, next to the scenario's truth.

Built from the aggregator's REST API (so the demo watches the same thing an operator would) plus the
scenario's faults; rendered by :mod:`sentinel.demo.view` (terminal) or :mod:`sentinel.demo.narrate`
(plain log lines). Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sentinel.demo.outcome import Fault, Outcome, Verdict, evaluate

#: Cell states of the hosts x GPUs grid, worst first: the worst open verdict on a GPU decides its colour.
CELL_STATES: tuple[str, ...] = ("faulty", "stuck", "silent", "degraded", "straggler", "ok", "unknown")
_VERDICT_CELL = {
    "faulty": "faulty",
    "stuck": "stuck",
    "host_silent": "silent",
    "degraded": "degraded",
    "straggler": "straggler",
}
_RAW_CELL = {"lost": "faulty", "unresponsive": "faulty", "ok": "ok"}


@dataclass(frozen=True)
class JobView:
    id: str
    state: str  # running, stalled, degraded, unknown (or what the aggregator says)
    ranks: int | None = None
    hosts: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """One poll of the aggregator, times in seconds since the demo started."""

    t_s: float
    jobs: Sequence[JobView] = ()
    hosts_seen: frozenset[str] = frozenset()  # hosts the aggregator knows (connected at least once)
    hosts_down: frozenset[str] = frozenset()  # hosts the aggregator reports as not connected / silent
    gpu_raw: Mapping[tuple[str, int], str] = field(default_factory=dict)  # ok / lost / unresponsive
    verdicts: Sequence[Verdict] = ()  # every verdict seen so far, open or closed
    reachable: bool = True  # False: the last poll failed


@dataclass(frozen=True)
class DemoInfo:
    """The static part: what runs where."""

    scenario: str
    hosts: Sequence[str]
    gpus_per_host: int
    duration_s: float
    faults: Sequence[Fault]
    url: str  # the aggregator's status page


@dataclass(frozen=True)
class ViewModel:
    info: DemoInfo
    snap: Snapshot
    cells: Mapping[tuple[str, int], str]
    outcome: Outcome

    @property
    def open_verdicts(self) -> list[Verdict]:
        return [v for v in self.snap.verdicts if v.state == "open"]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(CELL_STATES, 0)
        for state in self.cells.values():
            counts[state] += 1
        return counts


def cell_states(info: DemoInfo, snap: Snapshot) -> dict[tuple[str, int], str]:
    """The grid: worst open verdict per GPU, else the GPU's own reported state, else unknown."""
    rank = {state: i for i, state in enumerate(CELL_STATES)}
    cells: dict[tuple[str, int], str] = {}
    for host in info.hosts:
        for gpu in range(info.gpus_per_host):
            raw = snap.gpu_raw.get((host, gpu))
            if raw is not None:
                cells[(host, gpu)] = _RAW_CELL.get(raw, "ok")
            elif host in snap.hosts_seen:
                cells[(host, gpu)] = "ok"
            else:
                cells[(host, gpu)] = "unknown"
        if host in snap.hosts_down:
            for gpu in range(info.gpus_per_host):
                cells[(host, gpu)] = "silent"

    def worsen(key: tuple[str, int], state: str) -> None:
        if key in cells and rank[state] < rank[cells[key]]:
            cells[key] = state

    for verdict in snap.verdicts:
        if verdict.state != "open" or verdict.host is None:
            continue
        state = _VERDICT_CELL.get(verdict.kind, "degraded")
        if verdict.gpu is None:
            for gpu in range(info.gpus_per_host):
                worsen((verdict.host, gpu), state)
        else:
            worsen((verdict.host, verdict.gpu), state)
    return cells


def build_view(info: DemoInfo, snap: Snapshot) -> ViewModel:
    return ViewModel(
        info=info,
        snap=snap,
        cells=cell_states(info, snap),
        outcome=evaluate(info.faults, snap.verdicts, snap.t_s),
    )

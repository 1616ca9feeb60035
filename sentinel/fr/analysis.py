"""Cross-rank post-mortem analysis of Flight Recorder dumps: who stalls the job, and why.

:func:`analyze` takes one reduced dump per rank (:class:`~sentinel.fr.rank_summary.RankSummary`) and runs the
steps in order: members and world size (:mod:`~sentinel.fr.membership`), who waits on whom
(:mod:`~sentinel.fr.waits`, :mod:`~sentinel.fr.program_order`), op/size/dtype mismatches
(:mod:`~sentinel.fr.mismatch`), late ranks (:mod:`~sentinel.fr.lateness`), dumps taken at different
moments (:mod:`~sentinel.fr.skew`), then the verdict and its evidence (:mod:`~sentinel.fr.decision`,
:mod:`~sentinel.fr.findings`). Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from sentinel.fr.aside import Aside, run_aside
from sentinel.fr.decision import decide
from sentinel.fr.findings import add_context, add_durations, note_unrecorded_p2p
from sentinel.fr.lateness import Straggler, find_stragglers
from sentinel.fr.membership import Group, build_groups, complete_members, infer_world_size
from sentinel.fr.mismatch import frontier_mismatch, history_mismatch, p2p_mismatch
from sentinel.fr.program_order import apply_program_order
from sentinel.fr.rank_summary import KeyInfo, RankSummary
from sentinel.fr.records import TYPE_CHECKING
from sentinel.fr.skew import stale_ranks
from sentinel.fr.verdict import FrAnalysis
from sentinel.fr.waitgraph import find_culprits
from sentinel.fr.waits import find_waits

if TYPE_CHECKING:
    from typing import Any


#: Most findings printed; the JSON carries the same cap.
MAX_FINDINGS = 40


#: Ranks' timing columns (one per rank and group) from which the straggler lags are worth a forked child:
#: below it, the fork, the child's copy-on-write faults and its exit cost more than the lags themselves.
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
    groups = build_groups(summaries)
    world_size = infer_world_size(present, groups, summaries)
    missing = sorted(set(range(world_size)) - present)
    complete_members(groups, present, missing, world_size)
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
        for s in find_stragglers(groups)
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

    waits = find_waits(groups, keys)
    culprits = find_culprits(waits)
    order_notes = apply_program_order(culprits, waits, groups)
    late = find_stragglers(groups) if lags is None else [Straggler(*row) for row in lags.result()]
    stragglers = [s for s in late if s.behind is None]
    inherited = [s for s in late if s.behind is not None]
    frontier_mm = frontier_mismatch(groups, waits, keys) or p2p_mismatch(groups, keys)
    history_mm = history_mismatch(groups, keys)

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
    stale = stale_ranks(groups, last_t)
    decide(
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
        note_unrecorded_p2p(result, groups)
    add_context(result, groups, waits, missing, stragglers, inherited=inherited)
    add_durations(
        result, {s.rank: s.median_duration_ms for s in summaries if s.median_duration_ms >= 0}, stragglers
    )
    del result.findings[MAX_FINDINGS:]
    return result


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


def _name_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 60, name)

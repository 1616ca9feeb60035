"""The stuck detector's Flight Recorder dump judgement: a stalled job's dumps, analyzed post-mortem
(:mod:`sentinel.fr`), against the culprits the live heads named.

The dumps confirm the live culprit, correct it (they see every entry, the heads only the newest progress:
they win) or say nothing; the judgement of a stall in progress survives a restart (:class:`StuckMemory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import msgspec

from sentinel.aggregator.detectors.stuck_heads import DETECTOR, Stall, _ranks_summary
from sentinel.aggregator.state import JobView
from sentinel.aggregator.verdicts import Finding

DumpOutcome = Literal["confirmed", "corrected", "inconclusive"]
#: post-mortem verdicts that name culprits (``sentinel fr analyze``)
_NAMING = frozenset({"hang", "mismatch", "crash"})


@dataclass(frozen=True, slots=True)
class DumpJudgement:
    """The post-mortem analysis of a stalled job's Flight Recorder dumps, joined to the live verdicts."""

    outcome: DumpOutcome
    culprits: tuple[int, ...]
    verdict: str
    findings: tuple[str, ...]


class _DumpMemory(msgspec.Struct, kw_only=True):
    """A stall's dump judgement as the state store keeps it, with the stall it belongs to (pg, seq)."""

    outcome: DumpOutcome
    culprits: tuple[int, ...]
    verdict: str
    findings: tuple[str, ...]
    pg: str
    seq: int


class StuckMemory(msgspec.Struct, kw_only=True):
    """What survives a restart: the dump judgements of stalls in progress. A restart during a stall whose
    dumps corrected the live culprit must not bring back the culprit the heads alone would name."""

    dumps: dict[str, _DumpMemory] = {}


def judge_dumps(analysis: Mapping[str, Any] | None, live: list[int]) -> DumpJudgement:
    """Compare the dumps' analysis with the culprits the live heads named.

    ``confirmed``: the dumps name a live culprit; ``corrected``: they name other ranks (the dumps see every
    entry, the heads only the newest progress: they win); ``inconclusive``: no usable analysis, or one that
    names nobody (healthy, straggler, inconclusive).
    """
    if not analysis or "error" in analysis:
        why = str((analysis or {}).get("error") or "no analysis")
        return DumpJudgement("inconclusive", (), "error", (why[:300],))
    verdict = str(analysis.get("verdict") or "inconclusive")
    raw = analysis.get("culprit_ranks") or []
    culprits = tuple(r for r in raw if isinstance(r, int) and r >= 0)[:64]
    findings = tuple(str(f)[:300] for f in (analysis.get("findings") or [])[:3])
    if verdict not in _NAMING or not culprits:
        return DumpJudgement("inconclusive", culprits, verdict, findings)
    if set(culprits) & set(live):
        return DumpJudgement("confirmed", culprits, verdict, findings)
    return DumpJudgement("corrected", culprits, verdict, findings)


def _with_dumps(job: JobView, live: list[Finding], judged: DumpJudgement, stall: Stall) -> list[Finding]:
    """Live findings with the dump analysis joined: evidence added, or the culprit corrected."""
    stall.fr_outcome = judged.outcome
    said = "; ".join(judged.findings) or judged.verdict
    if judged.outcome != "corrected":
        note = (
            f"Flight Recorder dumps confirm ({judged.verdict}, culprit rank(s) {_ranks_summary(list(judged.culprits))}): {said}"
            if judged.outcome == "confirmed"
            else f"Flight Recorder dumps inconclusive ({judged.verdict}): {said}"
        )
        return [replace(f, evidence=(*f.evidence[:2], note, *f.evidence[2:])) for f in live]
    named = sorted({f.rank for f in live if f.rank is not None})
    evidence_t = min((f.evidence_t for f in live), default=0.0)
    out = []
    for rank in judged.culprits:
        view = job.ranks.get(rank)
        out.append(
            Finding(
                key=("stuck", job.id, str(rank)),
                detector=DETECTOR,
                kind="stuck",
                reason=f"fr_{judged.verdict}",
                action="restart_app",
                evidence=(
                    f"corrected by the Flight Recorder dumps: the live heads named rank(s) {_ranks_summary(named)}, "
                    f"the dumps of every rank show rank {rank} ({judged.verdict}): {said}",
                    "the dumps see every rank's whole recent history; the heads only its latest progress",
                ),
                evidence_t=evidence_t,
                host=view.host if view is not None else None,
                gpu=view.gpu if view is not None else None,
                job=job.id,
                rank=rank,
            )
        )
    stall.culprits = list(judged.culprits)
    return out

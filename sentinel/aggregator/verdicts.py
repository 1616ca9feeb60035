"""Verdicts: what the detectors conclude, opened once, updated while true, closed when the evidence is gone.

Detectors are pure: each returns the :class:`Finding` s that are true *now*. The :class:`VerdictBook`
reconciles them with what is open — a new key opens a verdict, a known key updates it (evidence, escalated
kind), a key a detector no longer reports closes it. Keys make verdicts deduplicated: one hardware verdict
per GPU, one stuck verdict per (job, rank), one straggler per GPU, one host_silent per host.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("faulty", "degraded", "stuck", "straggler", "host_silent")
ACTIONS = ("none", "restart_app", "drain", "reset_gpu", "reboot", "rma")
_KIND_RANK = {"host_silent": 0, "straggler": 1, "degraded": 2, "stuck": 3, "faulty": 4}
_ACTION_RANK = {action: i for i, action in enumerate(ACTIONS)}


def _severity(kind: str, action: str) -> tuple[int, int]:
    return _KIND_RANK[kind], _ACTION_RANK.get(action, 0)


MAX_EVIDENCE = 12


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector's claim that something is wrong right now; ``key`` identifies it across ticks."""

    key: tuple[str, ...]
    detector: str
    kind: str
    reason: str
    action: str
    evidence: tuple[str, ...]
    evidence_t: float  # when the evidence appeared (for detection latency)
    host: str | None = None
    gpu: int | None = None
    job: str | None = None
    rank: int | None = None


@dataclass(slots=True)
class Verdict:
    id: str
    key: tuple[str, ...]
    detector: str
    kind: str
    reason: str
    action: str
    host: str | None
    gpu: int | None
    job: str | None
    rank: int | None
    evidence: list[str]
    opened_at: float
    evidence_t: float
    updated_at: float
    closed_at: float | None = None
    close_reason: str = ""
    incident: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return "open" if self.closed_at is None else "closed"

    def to_dict(self, t0: float = 0.0) -> dict[str, Any]:
        """Contract sections 4/5: the report fields plus id, opened_at, closed_at, state."""
        return {
            "id": self.id,
            "t_s": round(self.opened_at - t0, 3),
            "kind": self.kind,
            "host": self.host,
            "gpu": self.gpu,
            "job": self.job,
            "rank": self.rank,
            "reason": self.reason,
            "action": self.action,
            "evidence": list(self.evidence),
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "state": self.state,
            "evidence_t": self.evidence_t,
            "updated_at": self.updated_at,
            "close_reason": self.close_reason,
            "incident": self.incident,
        }


@dataclass(frozen=True, slots=True)
class Change:
    verdict: Verdict
    what: str  # opened | updated | closed


class VerdictBook:
    """Open verdicts by key plus a bounded history of closed ones."""

    def __init__(self, closed_kept: int = 10000, id_prefix: str = "v") -> None:
        self.open: dict[tuple[str, ...], Verdict] = {}
        self.closed: deque[Verdict] = deque(maxlen=max(1, closed_kept))
        self.by_id: dict[str, Verdict] = {}
        self._next = 1
        self._prefix = id_prefix

    def reconcile(
        self, detector: str, findings: Iterable[Finding], now: float, scope: Any = None
    ) -> list[Change]:
        """Make the open verdicts of ``detector`` match ``findings``.

        ``scope`` (a predicate on keys) limits which open verdicts may be closed, for detectors that only
        looked at part of the fleet this time (the hardware detector on the GPUs that changed).
        """
        changes: list[Change] = []
        current: dict[tuple[str, ...], Finding] = {}
        for finding in findings:
            known = current.get(finding.key)
            if known is None:
                current[finding.key] = finding
            elif _severity(finding.kind, finding.action) > _severity(known.kind, known.action):
                current[finding.key] = _merge(finding, known)
            else:
                current[finding.key] = _merge(known, finding)
        for key, finding in current.items():
            verdict = self.open.get(key)
            if verdict is None:
                verdict = self._open(finding, now)
                changes.append(Change(verdict, "opened"))
            elif self._update(verdict, finding, now):
                changes.append(Change(verdict, "updated"))
        for key in [k for k, v in self.open.items() if v.detector == detector and k not in current]:
            if scope is not None and not scope(key):
                continue
            verdict = self.open.pop(key)
            verdict.closed_at = now
            verdict.close_reason = "evidence gone"
            self.closed.append(verdict)
            changes.append(Change(verdict, "closed"))
        self._trim()
        return changes

    def close(self, key: tuple[str, ...], now: float, reason: str) -> Change | None:
        verdict = self.open.pop(key, None)
        if verdict is None:
            return None
        verdict.closed_at = now
        verdict.close_reason = reason
        self.closed.append(verdict)
        self._trim()
        return Change(verdict, "closed")

    def _open(self, finding: Finding, now: float) -> Verdict:
        verdict = Verdict(
            id=f"{self._prefix}{self._next:06d}",
            key=finding.key,
            detector=finding.detector,
            kind=finding.kind,
            reason=finding.reason,
            action=finding.action,
            host=finding.host,
            gpu=finding.gpu,
            job=finding.job,
            rank=finding.rank,
            evidence=list(finding.evidence[:MAX_EVIDENCE]),
            opened_at=now,
            evidence_t=min(finding.evidence_t, now),
            updated_at=now,
        )
        self._next += 1
        self.open[finding.key] = verdict
        self.by_id[verdict.id] = verdict
        return verdict

    @staticmethod
    def _update(verdict: Verdict, finding: Finding, now: float) -> bool:
        changed = False
        if _severity(finding.kind, finding.action) > _severity(verdict.kind, verdict.action):
            verdict.kind, verdict.reason, verdict.action = finding.kind, finding.reason, finding.action
            changed = True
        evidence = list(finding.evidence[:MAX_EVIDENCE])
        if evidence != verdict.evidence:
            verdict.evidence = evidence
            changed = True
        for name in ("job", "rank"):
            if getattr(verdict, name) is None and getattr(finding, name) is not None:
                setattr(verdict, name, getattr(finding, name))
                changed = True
        if changed:
            verdict.updated_at = now
        return changed

    def _trim(self) -> None:
        if len(self.by_id) > len(self.open) + (self.closed.maxlen or 0) + 1024:
            keep = {v.id for v in self.open.values()} | {v.id for v in self.closed}
            self.by_id = {i: v for i, v in self.by_id.items() if i in keep}

    def all(self) -> list[Verdict]:
        return [*self.closed, *self.open.values()]


def _merge(primary: Finding, other: Finding) -> Finding:
    evidence = list(primary.evidence)
    evidence.extend(e for e in other.evidence if e not in evidence)
    return Finding(
        key=primary.key,
        detector=primary.detector,
        kind=primary.kind,
        reason=primary.reason,
        action=primary.action,
        evidence=tuple(evidence),
        evidence_t=min(primary.evidence_t, other.evidence_t),
        host=primary.host,
        gpu=primary.gpu,
        job=primary.job if primary.job is not None else other.job,
        rank=primary.rank if primary.rank is not None else other.rank,
    )

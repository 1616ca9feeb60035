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
from typing import Any, Literal

import msgspec

from sentinel.components.vocab import ACTIONS, VERDICT_KINDS, Action, VerdictKind, action_rank

KINDS = VERDICT_KINDS
_KIND_RANK = {kind: i for i, kind in enumerate(VERDICT_KINDS)}

__all__ = ["ACTIONS", "KINDS", "Change", "Finding", "Verdict", "VerdictBook"]


def _severity(kind: str, action: str) -> tuple[int, int]:
    return _KIND_RANK[kind], action_rank(action)  # type: ignore[index]


MAX_EVIDENCE = 12
#: hosts one verdict names at most (an NVLink domain of 72 GPUs has 18)
MAX_HOSTS = 1024
ChangeKind = Literal["opened", "updated", "closed"]


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector's claim that something is wrong right now; ``key`` identifies it across ticks."""

    key: tuple[str, ...]
    detector: str
    kind: VerdictKind
    reason: str
    action: Action
    evidence: tuple[str, ...]
    evidence_t: float  # when the evidence appeared (for detection latency)
    host: str | None = None
    gpu: int | None = None
    job: str | None = None
    rank: int | None = None
    #: None: the finding rests on what its subject reported or on configured expectations; N: it compares the
    #: subject with a yardstick learned from the fleet (a majority, a median) that N distinct hosts other
    #: than the subject hold — remediation acts on it only with a quorum of them
    learned_from: int | None = None
    #: every host a verdict about a unit larger than one host names (an NVLink domain: ``host`` is None);
    #: remediation may act on each (``remediation.drain_domains``)
    hosts: tuple[str, ...] = ()


@dataclass(slots=True)
class Verdict:
    id: str
    key: tuple[str, ...]
    detector: str
    kind: VerdictKind
    reason: str
    action: Action
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
    learned_from: int | None = None  # see Finding.learned_from
    hosts: list[str] = field(default_factory=list)  # see Finding.hosts

    @property
    def state(self) -> str:
        return "open" if self.closed_at is None else "closed"

    def to_dict(self, t0: float = 0.0) -> dict[str, Any]:
        """Contract sections 4/5: the report fields plus id, opened_at, closed_at, state."""
        return (
            {
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
            | ({"learned_from": self.learned_from} if self.learned_from is not None else {})
            | ({"hosts": list(self.hosts)} if self.hosts else {})
            | ({"remediation": list(self.extra["remediation"])} if "remediation" in self.extra else {})
        )


@dataclass(frozen=True, slots=True)
class Change:
    verdict: Verdict
    what: ChangeKind


class VerdictRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A verdict as the state store keeps it (every field of :class:`Verdict`, typed)."""

    id: str
    key: list[str]
    detector: str
    kind: VerdictKind
    reason: str
    action: Action
    host: str | None = None
    gpu: int | None = None
    job: str | None = None
    rank: int | None = None
    evidence: list[str] = []
    opened_at: float
    evidence_t: float
    updated_at: float
    closed_at: float | None = None
    close_reason: str = ""
    incident: str | None = None
    learned_from: int | None = None
    hosts: list[str] = []


class BookMeta(msgspec.Struct, kw_only=True):
    """The book's own counter: ids stay unique across restarts."""

    next_id: int


_record_decoder = msgspec.msgpack.Decoder(VerdictRecord)
_meta_decoder = msgspec.msgpack.Decoder(BookMeta)
_encoder = msgspec.msgpack.Encoder()
_META_KEY = "~meta"


class VerdictBook:
    """Open verdicts by key plus a bounded history of closed ones.

    It is a state-store holder (:mod:`sentinel.aggregator.store`): every verdict that opened, changed or
    closed since the last :meth:`snapshot` is written; one pushed out of the closed history is deleted.
    """

    state_name = "verdicts"

    def __init__(self, closed_kept: int = 10000, id_prefix: str = "v") -> None:
        self.open: dict[tuple[str, ...], Verdict] = {}
        self.closed: deque[Verdict] = deque(maxlen=max(1, closed_kept))
        self.by_id: dict[str, Verdict] = {}
        self._next = 1
        self._prefix = id_prefix
        self._changed: set[str] = set()
        self._dropped: set[str] = set()
        #: per detector, how long after a restore its restored verdicts are kept open while it gathers
        #: fresh evidence (a detector whose inputs are not persisted, e.g. the stuck detector's live heads)
        self.restore_hold_s: dict[str, float] = {}
        self._held: dict[tuple[str, ...], float] = {}

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
                self._changed.add(verdict.id)
                changes.append(Change(verdict, "updated"))
            if self._held:
                self._held.pop(key, None)  # its detector found the evidence again: an ordinary verdict
        for key in [k for k, v in self.open.items() if v.detector == detector and k not in current]:
            if scope is not None and not scope(key):
                continue
            held = self._held.get(key)
            if held is not None:
                if now < held:
                    continue  # restored, and its detector has not yet seen enough to judge it again
                del self._held[key]
            verdict = self.open.pop(key)
            verdict.closed_at = now
            verdict.close_reason = "evidence gone"
            self._keep_closed(verdict)
            changes.append(Change(verdict, "closed"))
        self._trim()
        return changes

    def _keep_closed(self, verdict: Verdict) -> None:
        closed = self.closed
        if closed.maxlen is not None and len(closed) >= closed.maxlen:
            self._dropped.add(closed[0].id)  # pushed out of the history: out of the store too
        closed.append(verdict)
        self._changed.add(verdict.id)

    def close(self, key: tuple[str, ...], now: float, reason: str) -> Change | None:
        verdict = self.open.pop(key, None)
        if verdict is None:
            return None
        verdict.closed_at = now
        verdict.close_reason = reason
        self._held.pop(key, None)
        self._keep_closed(verdict)
        self._trim()
        return Change(verdict, "closed")

    def touch(self, verdict: Verdict) -> None:
        """``verdict`` was changed from outside (its incident id): persist it with the next snapshot."""
        self._changed.add(verdict.id)

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
            learned_from=finding.learned_from,
            hosts=list(finding.hosts[:MAX_HOSTS]),
        )
        self._next += 1
        self.open[finding.key] = verdict
        self.by_id[verdict.id] = verdict
        self._changed.add(verdict.id)
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
        hosts = list(finding.hosts[:MAX_HOSTS])
        if hosts != verdict.hosts:  # a domain whose members came or went
            verdict.hosts = hosts
            changed = True
        if finding.learned_from != verdict.learned_from:  # its backing moved (or it is configured now)
            verdict.learned_from = finding.learned_from
            changed = True
        if changed:
            verdict.updated_at = now
        return changed

    def _trim(self) -> None:
        bound = len(self.open) + (self.closed.maxlen or 0) + 1024
        if len(self.by_id) > bound:
            keep = {v.id for v in self.open.values()} | {v.id for v in self.closed}
            self.by_id = {i: v for i, v in self.by_id.items() if i in keep}
        # Without a state store (state.enabled = false, the simulator) nobody takes the change sets: bound
        # them too, or every verdict id ever opened would stay. A store takes them every flush, far below this.
        if len(self._changed) > bound:
            self._changed = {i for i in self._changed if i in self.by_id}
        if len(self._dropped) > bound:
            self._dropped = set()

    def all(self) -> list[Verdict]:
        return [*self.closed, *self.open.values()]

    # -- state store ----------------------------------------------------------------------------------

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        """Verdicts changed since the last call (every kept one when ``full``), by id, plus the id counter."""
        if full:
            ids = [v.id for v in self.closed] + [v.id for v in self.open.values()]
            dropped: set[str] = set()
        else:
            if not self._changed and not self._dropped:
                return {}
            ids, dropped = list(self._changed - self._dropped), self._dropped
        out: dict[str, bytes | None] = dict.fromkeys(dropped)
        for verdict_id in ids:
            verdict = self.by_id.get(verdict_id)
            if verdict is not None:
                out[verdict_id] = _encoder.encode(_record(verdict))
        out[_META_KEY] = _encoder.encode(BookMeta(next_id=self._next))
        self._changed, self._dropped = set(), set()
        return out

    def restore(self, records: dict[str, bytes], now: float) -> None:
        """Open verdicts come back open with their ``opened_at``; closed ones refill the history.

        Verdicts of detectors named in :attr:`restore_hold_s` are held open that long: the detector's own
        inputs (live heads, lateness streaks, last-seen times) start empty after a restart, and a verdict
        must close because its evidence went away, not because the aggregator forgot it.
        """
        meta = records.get(_META_KEY)
        if meta is not None:
            self._next = max(self._next, _meta_decoder.decode(meta).next_id)
        closed: list[Verdict] = []
        for key, data in records.items():
            if key == _META_KEY:
                continue
            verdict = _verdict(_record_decoder.decode(data))
            self.by_id[verdict.id] = verdict
            number = verdict.id.removeprefix(self._prefix)
            if number.isdigit():
                self._next = max(self._next, int(number) + 1)
            if verdict.closed_at is None:
                self.open[verdict.key] = verdict
                hold = self.restore_hold_s.get(verdict.detector, 0.0)
                if hold > 0:
                    self._held[verdict.key] = now + hold
            else:
                closed.append(verdict)
        closed.sort(key=lambda v: (v.closed_at or 0.0, v.id))
        self.closed.extend(closed)
        self._trim()


def _record(verdict: Verdict) -> VerdictRecord:
    """The stored form: the record's fields read off the verdict (``extra`` is not kept)."""
    return msgspec.convert(verdict, VerdictRecord, from_attributes=True)


def _verdict(record: VerdictRecord) -> Verdict:
    verdict = msgspec.convert(record, Verdict, from_attributes=True)
    del verdict.evidence[MAX_EVIDENCE:]  # a stored record is outside input: keep the bound
    del verdict.hosts[MAX_HOSTS:]
    return verdict


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
        learned_from=_stronger(primary.learned_from, other.learned_from),
        hosts=primary.hosts or other.hosts,
    )


def _stronger(a: int | None, b: int | None) -> int | None:
    """The backing of two merged findings: the stronger one's (None, not learned, is the strongest)."""
    return None if a is None or b is None else max(a, b)

"""The goodput ledger: each incident's phases — fault, detected, named, drained, requeued, resumed — and the GPU
time it cost.

An entry opens with the first faulty or stuck verdict of an incident (keyed by its incident id, or by the
verdict's id when incidents are off), takes the drain and requeue times from the verdicts' remediation
records, and ends when the job's step clock moves again after the incident (``resumed_at``), or, for an
incident nothing requeued, when its verdicts closed. GPU time lost is the job's GPUs (1 without a job) times
the time from the fault to the end, or to now while it is open. Pure bookkeeping on an injected clock, fed by
the engine's verdict changes and a tick; durable through the state store; served with the incident by
``GET /api/v1/incidents/{id}``. See docs/remediation.md.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sentinel.aggregator.state import FleetState
from sentinel.aggregator.verdicts import Change, Verdict, VerdictBook

#: verdict kinds that open an incident (as the incident manager's)
TRIGGER_KINDS = frozenset({"faulty", "stuck"})
#: entries kept (open and ended); the oldest ended ones go first
MAX_ENTRIES = 10_000
#: (host, gpu) pairs whose incident counts and times are kept for the mean time between incidents
MAX_SUBJECTS = 100_000
#: an incident waiting for its job longer than this ends without a resumption
MAX_OPEN_S = 7 * 86400.0
#: the steps of an incident, each timed from the step before (the Prometheus ``phase`` label)
PHASES = ("detect", "name", "drain", "requeue", "resume")
PHASE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)


class Phases(msgspec.Struct, kw_only=True):
    """When each step of an incident happened (epoch seconds; None: it did not happen)."""

    fault_at: float | None = None
    detected_at: float | None = None
    named_at: float | None = None
    drained_at: float | None = None
    requeued_at: float | None = None
    resumed_at: float | None = None


class LedgerEntry(msgspec.Struct, kw_only=True):
    """One incident in the ledger (also its record in the state store)."""

    id: str
    cause: str  # the first verdict's reason (xid_79, not_entered_collective, ...)
    kind: str
    host: str | None
    gpu: int | None
    job: str | None
    gpus: int  # the job's GPUs when it was named (1 without a job)
    verdicts: list[str]
    phases: Phases
    ended_at: float | None = None

    def gpu_seconds_lost(self, now: float) -> float:
        start = self.phases.fault_at
        if start is None:
            return 0.0
        end = self.phases.resumed_at or self.ended_at or now
        return self.gpus * max(0.0, end - start)


def phases_of(verdicts: Iterable[dict[str, Any]]) -> Phases:
    """Phases from verdicts as the API shows them (an incident the ledger does not hold): the fault, its
    naming and what remediation recorded."""
    phases = Phases()
    for v in verdicts:
        _fold(phases, float(v["opened_at"]), float(v.get("evidence_t") or 0.0), v.get("gpu"), v.get("rank"))
        _fold_remediation(phases, v.get("remediation") or [])
    return phases


def _earliest(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


def _fold(phases: Phases, opened_at: float, evidence_t: float, gpu: Any, rank: Any) -> None:
    fault = evidence_t if 0 < evidence_t <= opened_at else opened_at
    phases.fault_at = _earliest(phases.fault_at, fault)
    phases.detected_at = _earliest(phases.detected_at, opened_at)
    if gpu is not None or rank is not None:
        phases.named_at = _earliest(phases.named_at, opened_at)


def _fold_remediation(phases: Phases, records: Iterable[dict[str, Any]]) -> None:
    for record in records:
        if record.get("dry_run"):
            continue
        if record.get("action") == "drain" and record.get("outcome") in ("done", "already"):
            phases.drained_at = _earliest(phases.drained_at, float(record["t"]))
        elif record.get("action") == "requeue" and record.get("outcome") == "done":
            phases.requeued_at = _earliest(phases.requeued_at, float(record["t"]))


class GoodputMetrics:
    def __init__(self, cluster: str, registry: CollectorRegistry | None) -> None:
        r = registry
        self.cluster = cluster
        self.phase = Histogram(
            "sentinel_incident_phase_seconds",
            "Time each step of an incident took, from the step before: detect (fault to first verdict), name "
            "(to the verdict naming a GPU or rank), drain, requeue, resume (to the job's step clock moving)",
            ["cluster", "phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.lost = Counter(
            "sentinel_goodput_gpu_hours_lost",
            "GPU-hours lost to ended incidents (the job's GPUs times fault to resumption), by cause",
            ["cluster", "cause"],
            registry=r,
        )
        self.by_node = Counter(
            "sentinel_incidents_by_node", "Incidents opened per node", ["cluster", "host"], registry=r
        )
        self.by_gpu = Counter(
            "sentinel_incidents_by_gpu", "Incidents opened per GPU", ["cluster", "host", "gpu"], registry=r
        )
        self.mtbi = Gauge(
            "sentinel_incident_mtbi_seconds",
            "Mean time between incidents of a node (gpu empty) or a GPU, once it had two",
            ["cluster", "host", "gpu"],
            registry=r,
        )
        self.waiting = Gauge(
            "sentinel_incident_waiting_seconds",
            "How long the oldest open incident has waited for its next step: drain (named, a drain "
            "attempted but not done), resume (drained or requeued, the job not moving again); 0 when none waits",
            ["cluster", "step"],
            registry=r,
        )
        self.open = Gauge(
            "sentinel_incidents_open", "Incidents whose job has not resumed yet", ["cluster"], registry=r
        ).labels(cluster)


class GoodputLedger:
    """The ledger; ``on_change`` is an engine listener (after the incident manager's), ``tick`` runs with the
    detector loop, and it is a state-store holder (``goodput``)."""

    state_name = "goodput"

    def __init__(
        self,
        book: VerdictBook,
        fleet: FleetState,
        *,
        clock: Callable[[], float],
        cluster: str = "default",
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.book = book
        self.fleet = fleet
        self.clock = clock
        self.metrics = GoodputMetrics(cluster, registry)
        self.entries: OrderedDict[str, LedgerEntry] = OrderedDict()
        self.open: dict[str, LedgerEntry] = {}
        self._by_subject: dict[str, str] = {}  # subject of an open entry → its id
        self._by_verdict: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        #: (host, gpu or None) → (incidents, first at, last at), for the mean time between incidents
        self._history: OrderedDict[tuple[str, int | None], tuple[int, float, float]] = OrderedDict()

    # -- input ----------------------------------------------------------------------------------------

    def on_change(self, change: Change) -> None:
        v = change.verdict
        if change.what != "opened" or v.kind not in TRIGGER_KINDS:
            return
        subject = f"job:{v.job}" if v.job else f"gpu:{v.host}/{v.gpu}"
        entry_id = v.incident or self._by_subject.get(subject) or f"v-{v.id}"
        entry = self.entries.get(entry_id)
        if entry is None or entry.ended_at is not None:
            entry = self._open(entry_id, v, subject)
        if v.id not in entry.verdicts:
            entry.verdicts.append(v.id)
            self._by_verdict[v.id] = entry.id
        _fold(entry.phases, v.opened_at, v.evidence_t, v.gpu, v.rank)
        self._dirty.add(entry.id)

    def _open(self, entry_id: str, v: Verdict, subject: str) -> LedgerEntry:
        job = self.fleet.jobs.get(v.job) if v.job else None
        gpus = max(1, len(job.ranks), job.world_size or 0) if job is not None else 1
        entry = LedgerEntry(
            id=entry_id,
            cause=v.reason,
            kind=v.kind,
            host=v.host,
            gpu=v.gpu,
            job=v.job,
            gpus=gpus,
            verdicts=[],
            phases=Phases(),
        )
        self.entries[entry_id] = entry
        self.entries.move_to_end(entry_id)
        self.open[entry_id] = entry
        self._by_subject[subject] = entry_id
        self._count(v)
        self._bound()
        return entry

    def _count(self, v: Verdict) -> None:
        if not v.host:
            return
        c = self.metrics.cluster
        self.metrics.by_node.labels(c, v.host).inc()
        subjects: list[tuple[str, int | None]] = [(v.host, None)]
        if v.gpu is not None:
            self.metrics.by_gpu.labels(c, v.host, str(v.gpu)).inc()
            subjects.append((v.host, v.gpu))
        for key in subjects:
            n, first, _ = self._history.get(key, (0, v.opened_at, v.opened_at))
            self._history[key] = (n + 1, first, v.opened_at)
            self._history.move_to_end(key)
            if n + 1 >= 2:
                gpu = "" if key[1] is None else str(key[1])
                self.metrics.mtbi.labels(c, key[0], gpu).set((v.opened_at - first) / n)
        while len(self._history) > MAX_SUBJECTS:
            self._history.popitem(last=False)

    def _bound(self) -> None:
        while len(self.entries) > MAX_ENTRIES:
            oldest = next((k for k, e in self.entries.items() if e.ended_at is not None), None)
            if oldest is None:
                break
            gone = self.entries.pop(oldest)
            for vid in gone.verdicts:
                self._by_verdict.pop(vid, None)
            self._dirty.discard(oldest)
            self._deleted.add(oldest)

    def forget_host(self, host: str) -> None:
        """A host the fleet forgot (retention, eviction): its incidents, history and series go with it."""
        for entry_id in [eid for eid, e in self.entries.items() if e.host == host]:
            gone = self.entries.pop(entry_id)
            self.open.pop(entry_id, None)
            for vid in gone.verdicts:
                self._by_verdict.pop(vid, None)
            self._dirty.discard(entry_id)
            self._deleted.add(entry_id)
        for subject in [s for s, eid in self._by_subject.items() if eid not in self.entries]:
            del self._by_subject[subject]
        c = self.metrics.cluster
        for key in [k for k in self._history if k[0] == host]:
            del self._history[key]
            gpu = "" if key[1] is None else str(key[1])
            with contextlib.suppress(KeyError):
                self.metrics.mtbi.remove(c, host, gpu)
            if key[1] is None:
                with contextlib.suppress(KeyError):
                    self.metrics.by_node.remove(c, host)
            else:
                with contextlib.suppress(KeyError):
                    self.metrics.by_gpu.remove(c, host, gpu)

    # -- time -----------------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Take drains and requeues from the verdicts, notice a job moving again, end what is over."""
        waiting = {"drain": 0.0, "resume": 0.0}
        for entry in list(self.open.values()):
            verdicts = [v for vid in entry.verdicts if (v := self.book.by_id.get(vid)) is not None]
            before = msgspec.structs.replace(entry.phases)
            for v in verdicts:
                _fold_remediation(entry.phases, v.extra.get("remediation") or [])
            p = entry.phases
            since = max(t for t in (p.named_at, p.detected_at, p.drained_at, p.requeued_at) if t is not None)
            job = self.fleet.jobs.get(entry.job) if entry.job else None
            if job is not None and math.isfinite(job.last_progress_at) and job.last_progress_at > since:
                p.resumed_at = job.last_progress_at
                self._end(entry, p.resumed_at)
                continue
            all_closed = all(v.closed_at is not None for v in verdicts)
            if (all_closed and p.requeued_at is None) or now - (p.fault_at or now) > MAX_OPEN_S:
                closed = [v.closed_at for v in verdicts if v.closed_at is not None]
                self._end(entry, max(closed) if closed else now)
                continue
            if p != before:
                self._dirty.add(entry.id)
            start = p.named_at or p.detected_at or now
            tried = any(
                r.get("action") == "drain" for v in verdicts for r in v.extra.get("remediation") or []
            )
            if p.drained_at is None and tried:
                waiting["drain"] = max(waiting["drain"], now - start)
            elif p.drained_at is not None and entry.job:
                waiting["resume"] = max(waiting["resume"], now - (p.requeued_at or p.drained_at))
        for step, age in waiting.items():
            self.metrics.waiting.labels(self.metrics.cluster, step).set(age)
        self.metrics.open.set(len(self.open))

    def _end(self, entry: LedgerEntry, at: float) -> None:
        entry.ended_at = at
        self.open.pop(entry.id, None)
        for subject, eid in list(self._by_subject.items()):
            if eid == entry.id:
                del self._by_subject[subject]
        self._dirty.add(entry.id)
        c, p = self.metrics.cluster, entry.phases
        previous = p.fault_at
        steps = (p.detected_at, p.named_at, p.drained_at, p.requeued_at, p.resumed_at)
        for phase, t in zip(PHASES, steps, strict=True):
            if t is None or previous is None:
                continue
            self.metrics.phase.labels(c, phase).observe(max(0.0, t - previous))
            previous = t
        self.metrics.lost.labels(c, entry.cause).inc(entry.gpu_seconds_lost(at) / 3600.0)

    # -- reading --------------------------------------------------------------------------------------

    def entry_of(self, incident_id: str, verdict_ids: Iterable[str] = ()) -> LedgerEntry | None:
        found = self.entries.get(incident_id)
        if found is None:
            for vid in verdict_ids:
                if (eid := self._by_verdict.get(vid)) is not None:
                    return self.entries.get(eid)
        return found

    def annotate(self, incident: Any, now: float) -> Any:
        """The incident with its ``phases`` and ``gpu_seconds_lost`` (from the ledger, or from its verdicts)."""
        entry = self.entry_of(incident.id, [str(v.get("id")) for v in incident.verdicts])
        if entry is not None:
            phases, lost = entry.phases, entry.gpu_seconds_lost(now)
        else:
            phases = phases_of(incident.verdicts)
            lost = 0.0 if phases.fault_at is None else max(0.0, now - phases.fault_at)
        return msgspec.structs.replace(incident, phases=phases, gpu_seconds_lost=round(lost, 3))

    # -- durable state ----------------------------------------------------------------------------------

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        keys = set(self.entries) if full else self._dirty
        out: dict[str, bytes | None] = {
            k: _encoder.encode(self.entries[k]) for k in keys if k in self.entries
        }
        if not full:
            out.update(dict.fromkeys(self._deleted))
        self._dirty = set()
        self._deleted = set()
        return out

    def restore(self, records: dict[str, bytes], now: float) -> None:
        entries = sorted(
            (_decoder.decode(data) for data in records.values()), key=lambda e: e.phases.fault_at or 0
        )
        for entry in entries[-MAX_ENTRIES:]:
            self.entries[entry.id] = entry
            for vid in entry.verdicts:
                self._by_verdict[vid] = entry.id
            if entry.ended_at is None:
                self.open[entry.id] = entry
                self._by_subject[f"job:{entry.job}" if entry.job else f"gpu:{entry.host}/{entry.gpu}"] = (
                    entry.id
                )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(LedgerEntry)

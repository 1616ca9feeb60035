"""Incidents — the distributed flight recorder.

When a GPU turns faulty or a job stalls, every agent involved (all hosts of the job, and the faulty host) is
asked for its ring-buffer snapshot of the minutes before the verdict. The snapshots are merged into one
time-ordered timeline, stored as gzip JSON in the state directory with an SQLite index, and served by the API
and ``sentinel incident``.

Snapshots come from the network: their shape is checked entry by entry, sizes are bounded, and a host that
does not answer in time is listed as missing rather than holding the incident back.

An Xid storm (one job's GPUs reporting application or sympathetic Xids within seconds) is one incident for
the job, whatever the number of its GPUs: it names the origin and counts the GPUs and hosts (``storm``).

A stuck job's incident also gets a job-wide Flight Recorder dump (:mod:`sentinel.aggregator.frdumps`): the
job's agents are asked for ``fr_dump`` while the snapshots are gathered; the incident is saved with
``fr_dump.state = "collecting"`` as soon as the timeline is merged, then saved again with the dumps' analysis
(verdict, culprit ranks, collective, findings) once it ran.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from sentinel.aggregator.claims import dump_owners
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.evidence import ANSWER_MARGIN_S, EvidenceGate, EvidenceReport, evidence_hosts
from sentinel.aggregator.evidence import gather as gather_evidence
from sentinel.aggregator.frdumps import (
    FrDumpSettings,
    analyze_dumps,
    per_host_budget,
    store_answer,
    why_no_dumps,
)
from sentinel.aggregator.goodput import Phases
from sentinel.aggregator.verdicts import Change, Verdict
from sentinel.components.xid.storm import STORM, Burst
from sentinel.config.aggregator import IncidentsConfig
from sentinel.log import get_logger
from sentinel.wire import (
    MAX_EVIDENCE_BYTES,
    Answer,
    Command,
    CommandResult,
    FrDumpRequest,
    RingEntry,
    SampleEntry,
    Snapshot,
    SnapshotRequest,
)


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.incidents")


MAX_INCIDENT_FILE_BYTES = 256 * 1024 * 1024
TRIGGER_KINDS = frozenset({"faulty", "stuck"})
DEFAULT_FR_DUMPS = FrDumpSettings()

Requester = Callable[[str, Command, float], Awaitable[CommandResult | None]]

FrDumpState = Literal["collecting", "done", "no_dumps", "failed"]


class TimelineEntry(msgspec.Struct, kw_only=True):
    """One thing one host saw (or a verdict), in the incident's merged timeline."""

    t: float
    host: str
    type: Literal["sample", "event", "heads", "procs", "verdict"]
    data: dict[str, Any]


class FrDumpReport(msgspec.Struct, kw_only=True):
    """A stuck incident's job-wide Flight Recorder part: what each agent answered, the dumps kept, their
    analysis (``sentinel fr analyze --json``) and how it was joined to the live verdict."""

    state: FrDumpState
    ranks: list[int] = []
    requested_at: float | None = None
    finished_at: float | None = None
    hosts: dict[str, dict[str, Any]] = {}  # host → its answer's report (see frdumps.store_answer)
    missing_hosts: list[str] = []
    dir: str | None = None
    analysis: dict[str, Any] | None = None
    error: str | None = None
    #: the dumps' judgement of the live verdict: confirmed | corrected | inconclusive (None: stall over)
    joined: str | None = None


class StormReport(msgspec.Struct, kw_only=True):
    """An Xid storm's incident: where it began and how far it reached (its verdict names the same origin)."""

    origin_host: str
    origin_gpu: int
    origin_xid: int
    origin_t: float
    gpus: int
    hosts: int
    reports: int
    #: reports on GPUs other than the origin, not judged on their own
    sympathetic: int
    codes: dict[int, int]
    first_t: float
    last_t: float


def storm_report(burst: Burst) -> StormReport:
    origin = burst.origin
    return StormReport(
        origin_host=origin.host,
        origin_gpu=origin.gpu,
        origin_xid=origin.code,
        origin_t=origin.t,
        gpus=burst.gpu_count,
        hosts=len(burst.hosts),
        reports=burst.reports,
        sympathetic=burst.sympathetic,
        codes=dict(burst.codes),
        first_t=burst.first_t,
        last_t=burst.last_t,
    )


class Incident(msgspec.Struct, kw_only=True):
    """The distributed flight recorder's record of one faulty GPU or stalled job (stored as gzip JSON)."""

    id: str
    created_at: float
    job: str | None
    verdicts: list[dict[str, Any]]  # each as the API shows a verdict
    hosts: list[str]
    missing_hosts: list[str]
    window: tuple[float, float]
    problems: list[str]
    timeline: list[TimelineEntry]
    fr_dump: FrDumpReport | None = None
    #: filled when served (``GET /api/v1/incidents/{id}``) from the goodput ledger
    phases: Phases | None = None
    gpu_seconds_lost: float | None = None
    #: what the named hosts captured before any drain (stacks, kernel window, GPU snapshots)
    evidence: EvidenceReport | None = None
    #: an Xid storm's origin and reach
    storm: StormReport | None = None

    def summary(self) -> dict[str, Any]:
        """The incident as ``GET /api/v1/incidents`` lists it: without its timeline, with its size."""
        doc: dict[str, Any] = msgspec.to_builtins(self)
        del doc["timeline"]
        doc["entries"] = len(self.timeline)
        return doc


_json_encoder = msgspec.json.Encoder()


def snapshot_entries(
    host: str, answer: Answer | None, t0: float, t1: float, *, samples: bool = True
) -> tuple[list[TimelineEntry], str | None]:
    """The timeline entries of one host's snapshot in [t0, t1]; (entries, problem or None).

    The snapshot arrived typed and bounded (the frame's decoder validated every entry); what is left to
    check is that the agent answered with a snapshot at all. ``samples=False`` keeps only events, heads and
    job maps: the GPU samples of hosts that are not the subject of the incident are noise, and on a
    1,000-host job they would be most of the memory.
    """
    if not isinstance(answer, Snapshot):
        return [], f"{host}: answered the snapshot with {type(answer).__name__}, not a snapshot"
    out: list[TimelineEntry] = []
    for entry in answer.entries:
        if not t0 <= entry.t <= t1 or (isinstance(entry, SampleEntry) and not samples):
            continue
        doc = _to_builtins(entry)
        out.append(TimelineEntry(t=entry.t, host=host, type=doc["type"], data=doc["data"]))
    return out, None


def _to_builtins(entry: RingEntry) -> dict[str, Any]:
    doc: dict[str, Any] = msgspec.to_builtins(entry)
    return doc


def merge_timeline(
    snapshots: dict[str, Answer | None], t0: float, t1: float, max_entries: int
) -> tuple[list[TimelineEntry], list[str]]:
    """One time-ordered timeline from every host's snapshot; returns (entries, problems).

    Entries outside [t0, t1] are skipped and an answer that is not a snapshot is named in ``problems``, so
    one broken agent cannot spoil the others' contribution.
    """
    merged: list[TimelineEntry] = []
    problems: list[str] = []
    for host, payload in snapshots.items():
        entries, problem = snapshot_entries(host, payload, t0, t1)
        merged.extend(entries)
        if problem:
            problems.append(problem)
    return _ordered(merged, max_entries, problems), problems


def _ordered(merged: list[TimelineEntry], max_entries: int, problems: list[str]) -> list[TimelineEntry]:
    merged.sort(key=lambda e: (e.t, e.host))
    if len(merged) > max_entries:
        problems.append(f"timeline cut to the last {max_entries} of {len(merged)} entries")
        merged = merged[-max_entries:]
    return merged


_json_decoder = msgspec.json.Decoder(Incident)


class IncidentStore:
    """SQLite index plus one gzip JSON document per incident under ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "incidents"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db_path = state_dir / "incidents.sqlite3"
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS incidents ("
                "id TEXT PRIMARY KEY, created_at REAL NOT NULL, kind TEXT, reason TEXT, job TEXT, host TEXT, "
                "gpu INTEGER, hosts TEXT, verdicts TEXT, entries INTEGER, missing TEXT, file TEXT, storm TEXT)"
            )
            columns = {row[1] for row in db.execute("PRAGMA table_info(incidents)")}
            if "storm" not in columns:  # an index written before incidents carried storms
                db.execute("ALTER TABLE incidents ADD COLUMN storm TEXT")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=10)

    def save(self, incident: Incident) -> None:
        name = f"{incident.id}.json.gz"
        tmp = self.dir / (name + ".tmp")
        with gzip.open(tmp, "wb") as out:
            out.write(_json_encoder.encode(incident))
        tmp.replace(self.dir / name)
        first = incident.verdicts[0] if incident.verdicts else {}
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO incidents (id, created_at, kind, reason, job, host, gpu, hosts, verdicts, "
                "entries, missing, file, storm) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    incident.id,
                    incident.created_at,
                    first.get("kind"),
                    first.get("reason"),
                    incident.job,
                    first.get("host"),
                    first.get("gpu"),
                    json.dumps(incident.hosts),
                    json.dumps([v.get("id") for v in incident.verdicts]),
                    len(incident.timeline),
                    json.dumps(incident.missing_hosts),
                    name,
                    _json_encoder.encode(incident.storm).decode() if incident.storm is not None else None,
                ),
            )

    def list(self, limit: int = 200) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, created_at, kind, reason, job, host, gpu, hosts, verdicts, entries, missing, storm "
                "FROM incidents ORDER BY created_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {
                "id": r[0],
                "created_at": r[1],
                "kind": r[2],
                "reason": r[3],
                "job": r[4],
                "host": r[5],
                "gpu": r[6],
                "hosts": json.loads(r[7] or "[]"),
                "verdicts": json.loads(r[8] or "[]"),
                "entries": r[9],
                "missing_hosts": json.loads(r[10] or "[]"),
                **({"storm": json.loads(r[11])} if r[11] else {}),
            }
            for r in rows
        ]

    def get(self, incident_id: str) -> Incident | None:
        with self._connect() as db:
            row = db.execute("SELECT file FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        if row is None:
            return None
        path = self.dir / Path(row[0]).name
        try:
            with gzip.open(path, "rb") as handle:
                raw = handle.read(MAX_INCIDENT_FILE_BYTES + 1)
        except OSError:
            return None
        if len(raw) > MAX_INCIDENT_FILE_BYTES:
            return None
        try:
            return _json_decoder.decode(raw)
        except msgspec.DecodeError as exc:  # damaged or of another version: listed, not served
            log().warning("incident_unreadable", incident=incident_id, error=str(exc)[:300])
            return None


class IncidentManager:
    """Turns opened faulty/stuck verdicts and Xid storms into incidents (at most one per job, GPU or storm per
    cooldown; a storm whose origin GPU's fault has one already joins it)."""

    def __init__(
        self,
        engine: Engine,
        store: IncidentStore | None,
        requester: Requester,
        config: IncidentsConfig,
        *,
        clock: Callable[[], float] = time.time,
        on_saved: Callable[[Incident], None] | None = None,
        fr_dumps: FrDumpSettings | None = DEFAULT_FR_DUMPS,
        evidence_gate: EvidenceGate | None = None,
    ) -> None:
        self.engine = engine
        #: drains of an incident's hosts wait here until its evidence is attached
        self.evidence_gate = evidence_gate if evidence_gate is not None else EvidenceGate()
        self.fr_dumps = fr_dumps
        self.store = store
        self.requester = requester
        self.config = config
        self.clock = clock
        self.on_saved = on_saved
        self.recent: dict[str, tuple[float, str]] = {}  # subject → (created_at, incident id)
        self.tasks: set[asyncio.Task[None]] = set()
        self.in_memory: dict[str, Incident] = {}  # when there is no store (tests, in-process)

    def on_change(self, change: Change) -> None:
        verdict = change.verdict
        storm = verdict.reason == STORM.reason
        if change.what != "opened" or not (verdict.kind in TRIGGER_KINDS or storm) or not self.config.enabled:
            return
        if storm:
            subject = "storm:" + "/".join(verdict.key)
            origin = self.recent.get(f"gpu:{verdict.host}/{verdict.gpu}")
            if origin is not None and self.clock() - origin[0] < self.config.cooldown_s:
                verdict.incident = origin[1]  # the origin's own fault already has the incident
                return
        elif verdict.kind == "stuck" and verdict.job:
            subject = f"job:{verdict.job}"
        elif verdict.hosts and not verdict.host:  # an NVLink domain's verdict
            subject = "domain:" + "/".join(verdict.key)
        else:
            subject = f"gpu:{verdict.host}/{verdict.gpu}"
        now = self.clock()
        known = self.recent.get(subject)
        if known is not None and now - known[0] < self.config.cooldown_s:
            verdict.incident = known[1]
            return
        incident_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(3)
        self.recent[subject] = (now, incident_id)
        if len(self.recent) > 10000:
            cutoff = now - self.config.cooldown_s
            self.recent = {k: v for k, v in self.recent.items() if v[0] >= cutoff}
        verdict.incident = incident_id
        try:
            task = asyncio.get_running_loop().create_task(self.collect(incident_id, verdict, now))
        except RuntimeError:
            return  # no event loop (virtual-clock simulation): incidents need live agents
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if self.config.evidence:
            self.evidence_gate.open(incident_id, self._evidence_hosts(verdict), self._evidence_wait_s())

    def _hosts(self, verdict: Verdict) -> list[str]:
        hosts: list[str] = []
        if verdict.host:
            hosts.append(verdict.host)
        hosts += [h for h in verdict.hosts if h not in hosts]  # a domain verdict's hosts
        job = self.engine.fleet.jobs.get(verdict.job or "") if verdict.job else None
        if job is not None:
            for name in sorted({r.host for r in job.ranks.values() if r.host}):
                if name not in hosts:
                    hosts.append(name)
        return hosts[: self.config.max_hosts]

    def _evidence_hosts(self, verdict: Verdict) -> list[str]:
        return evidence_hosts(verdict, self._hosts(verdict), self.config.evidence_max_hosts)

    def _evidence_wait_s(self) -> float:
        """How long a drain may wait for the evidence: its own deadline, or the timeline's it is saved after."""
        return max(self.config.evidence_timeout_s, self.config.snapshot_timeout_s) + 2 * ANSWER_MARGIN_S + 1.0

    async def collect(self, incident_id: str, verdict: Verdict, now: float) -> None:
        try:
            await self._collect(incident_id, verdict, now)
        except Exception as exc:  # an incident is best effort; the aggregator carries on
            log().warning("incident_failed", incident=incident_id, error=f"{type(exc).__name__}: {exc}")
        finally:
            self.evidence_gate.settle(incident_id)  # whatever happened, drains wait no longer

    async def _collect(self, incident_id: str, verdict: Verdict, now: float) -> None:
        hosts = self._hosts(verdict)
        fr_task: asyncio.Task[FrDumpReport] | None = None
        if self.fr_dumps is not None and verdict.kind == "stuck" and verdict.job and hosts:
            fr_task = asyncio.get_running_loop().create_task(
                self._fr_dump(incident_id, verdict, hosts, now, self.fr_dumps)
            )
        evidence_task: asyncio.Task[EvidenceReport] | None = None
        if self.config.evidence and hosts:
            evidence_task = asyncio.get_running_loop().create_task(
                gather_evidence(
                    self.requester,
                    incident_id,
                    verdict,
                    self._evidence_hosts(verdict),
                    self.config,
                    clock=self.clock,
                    # an answer must fit one frame, as the FR dumps' share does
                    max_answer_bytes=self.fr_dumps.max_bytes_per_host
                    if self.fr_dumps
                    else MAX_EVIDENCE_BYTES,
                )
            )
        try:
            incident = await self._timeline(incident_id, verdict, now, hosts, fr_task is not None)
        except BaseException:
            for task in (fr_task, evidence_task):
                if task is not None:
                    task.cancel()
            raise
        if evidence_task is not None:
            await self._attach_evidence(incident, evidence_task)
        if fr_task is not None:
            try:
                fr = await fr_task
            except Exception as exc:  # the FR part failed: say so with the reason, never stay "collecting"
                fr = FrDumpReport(state="failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            if verdict.job:
                # no analysis: the report's error is what the dumps say (inconclusive)
                fr.joined = self.engine.join_dumps(
                    verdict.job, fr.analysis or {"error": fr.error or fr.state}
                )
            incident.fr_dump = fr
            await self._save(incident)
            log().info(
                "incident_fr_dump",
                incident=incident_id,
                state=fr.state,
                ranks=len(fr.ranks),
                verdict=(fr.analysis or {}).get("verdict"),
            )

    async def _attach_evidence(self, incident: Incident, task: asyncio.Task[EvidenceReport]) -> None:
        """Save the incident with its hosts' evidence, then let drains of those hosts go ahead."""
        try:
            incident.evidence = await task
        except Exception as exc:  # the evidence part failed: say so, never hold drains on it
            incident.evidence = EvidenceReport(
                state="failed", problems=[f"{type(exc).__name__}: {exc}"[:300]]
            )
        try:
            await self._save(incident)
        finally:
            self.evidence_gate.settle(incident.id)
        evidence = incident.evidence
        log().info(
            "incident_evidence",
            incident=incident.id,
            state=evidence.state,
            hosts=len(evidence.hosts),
            missing=len(evidence.missing_hosts),
        )

    async def _save(self, incident: Incident) -> None:
        if self.store is not None:
            await asyncio.to_thread(self.store.save, incident)
        else:
            self.in_memory[incident.id] = incident

    async def _timeline(
        self, incident_id: str, verdict: Verdict, now: float, hosts: list[str], fr_pending: bool
    ) -> Incident:
        since = now - self.config.window_s
        timeout = self.config.snapshot_timeout_s

        async def ask(host: str) -> tuple[str, CommandResult | None]:
            command = Command(id=f"{incident_id}:{host}", request=SnapshotRequest(since=since))
            try:
                return host, await asyncio.wait_for(self.requester(host, command, timeout), timeout + 1.0)
            except (TimeoutError, ConnectionError):
                return host, None

        # merge each answer as it arrives, so at most the answers in flight are held in memory
        focus = {verdict.host} if verdict.host else set()
        merged: list[TimelineEntry] = []
        problems: list[str] = []
        missing: list[str] = []
        for next_answer in asyncio.as_completed([ask(h) for h in hosts]):
            host, result = await next_answer
            if result is None or not result.ok:
                missing.append(host)
                continue
            entries, problem = snapshot_entries(
                host, result.answer, since, now + timeout + 1.0, samples=host in focus
            )
            merged.extend(entries)
            if problem:
                problems.append(problem)
            if len(merged) > 2 * self.config.max_entries:
                merged = _ordered(merged, self.config.max_entries, problems)
        end = self.clock()
        timeline = _ordered(merged, self.config.max_entries, problems)
        missing.sort()
        related = [
            v.to_dict() for v in self.engine.book.all() if v.incident == incident_id or v.id == verdict.id
        ]
        for v in related:
            timeline.append(TimelineEntry(t=v["opened_at"], host=v["host"] or "", type="verdict", data=v))
        timeline.sort(key=lambda e: (e.t, e.host))
        incident = Incident(
            id=incident_id,
            created_at=now,
            job=verdict.job,
            verdicts=related,
            hosts=hosts,
            missing_hosts=missing,
            window=(since, end),
            problems=problems,
            timeline=timeline,
            fr_dump=FrDumpReport(state="collecting") if fr_pending else None,
            storm=self._storm(verdict),
        )
        await self._save(incident)
        log().info(
            "incident_recorded",
            incident=incident_id,
            hosts=len(hosts),
            missing=len(missing),
            entries=len(timeline),
        )
        if self.on_saved is not None:
            self.on_saved(incident)
        return incident

    def _storm(self, verdict: Verdict) -> StormReport | None:
        """The storm behind a storm verdict as it stands now (it may have grown since the verdict opened)."""
        if verdict.reason != STORM.reason or len(verdict.key) < 2:
            return None
        burst = self.engine.fleet.xid_storms.bursts.get(verdict.key[1])
        return storm_report(burst) if burst is not None else None

    async def _fr_dump(
        self, incident_id: str, verdict: Verdict, hosts: list[str], now: float, settings: FrDumpSettings
    ) -> FrDumpReport:
        """Ask the job's agents for their ranks' dumps, store them, analyze them: the incident's fr_dump."""
        started = self.clock()
        since = min(verdict.evidence_t, now) - settings.clock_skew_s
        request = FrDumpRequest(
            job=verdict.job,
            collect=True,
            since=since,
            wait_s=settings.wait_s,
            max_bytes=per_host_budget(settings, len(hosts)),
        )
        timeout = settings.wait_s + settings.answer_margin_s
        if self.store is not None:
            root = self.store.dir / f"{incident_id}.fr"
            keep = True
        else:
            root = Path(tempfile.mkdtemp(prefix="sentinel-fr-"))
            keep = False
        report = FrDumpReport(state="done", requested_at=started, dir=str(root) if keep else None)

        async def ask(host: str) -> tuple[str, CommandResult | None]:
            command = Command(id=f"{incident_id}:fr:{host}", request=request)
            try:
                return host, await asyncio.wait_for(self.requester(host, command, timeout), timeout + 1.0)
            except (TimeoutError, ConnectionError):
                return host, None

        seen: set[int] = set()
        budget = settings.max_total_bytes
        fleet = self.engine.fleet
        job = fleet.jobs.get(verdict.job or "")
        owners = dump_owners(job.ranks) if job is not None else {}
        try:
            for next_answer in asyncio.as_completed([ask(h) for h in hosts]):
                host, result = await next_answer
                if result is None or not result.ok:
                    report.missing_hosts.append(host)
                    continue
                host_report, used = await asyncio.to_thread(
                    functools.partial(store_answer, owners=owners), root, host, result.answer, seen, budget
                )
                for rank in host_report.get("refused", ()):
                    fleet.refusals.refused(
                        "rank_not_owned",
                        "fr_dump_refused",
                        host=host,
                        job=(verdict.job or "")[:256],
                        rank=rank,
                        holder=owners.get(rank),
                        incident=incident_id,
                    )
                budget -= used
                report.hosts[host] = host_report
            report.missing_hosts.sort()
            report.ranks = sorted(seen)
            if not seen:
                report.state = "no_dumps"
                report.error = why_no_dumps(report.hosts, report.missing_hosts)
                return report
            cancel = threading.Event()
            try:
                analysis = await asyncio.to_thread(analyze_dumps, root, settings.workers, cancel)
            except asyncio.CancelledError:
                cancel.set()  # shutdown: the workers are killed at once instead of finishing their dumps
                raise
            if "error" in analysis:
                report.state = "failed"
                report.error = analysis["error"]
            else:
                report.analysis = analysis
            return report
        finally:
            report.finished_at = self.clock()
            if not keep or not seen:
                await asyncio.to_thread(shutil.rmtree, root, True)

    def list(self) -> list[dict[str, Any]]:
        if self.store is not None:
            return self.store.list()
        return [inc.summary() for inc in sorted(self.in_memory.values(), key=lambda i: -i.created_at)]

    def get(self, incident_id: str) -> Incident | None:
        if self.store is not None:
            return self.store.get(incident_id)
        return self.in_memory.get(incident_id)

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

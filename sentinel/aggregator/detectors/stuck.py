"""Stuck detector: which rank stalls a job, from every rank's live collective progress.

A collective is named by (process group, seq) across ranks. When some members wait in it and others never
entered it, the ones that did not enter are suspects — unless they are themselves waiting in another group,
in which case the wait is followed into that group until a rank that waits for nothing is found: the root.
When every member is inside the collective and none completes, the ranks themselves are fine and the
transport is not: recent NCCL NET errors or NVLink error rates on the hosts involved name the culprit.
A rank blocked in a send/recv waits for its peer when the peer never posted the counterpart; when every
stalled rank is blocked in one (a pipeline stage that never sent), those edges alone name the rank, or a
cycle of them a deadlock, or — nobody to blame — an inconclusive ``p2p_stalled`` verdict.
Without flight-recorder heads, PyTorch watchdog timeouts say who waited; the ranks that did not time out
are the suspects. A waiting peer is never blamed.

This module is the detector itself (per-job examinations kept while valid, restored dump judgements);
reading the heads is :mod:`.stuck_heads`, concluding from them :mod:`.stuck_causes`, and joining the Flight
Recorder dumps' post-mortem :mod:`.stuck_dumps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import msgspec

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation, Steps, run_steps
from sentinel.aggregator.detectors.stuck_causes import _from_watchdog, conclude
from sentinel.aggregator.detectors.stuck_dumps import (
    DumpJudgement,
    StuckMemory,
    _DumpMemory,
    _with_dumps,
    judge_dumps,
)
from sentinel.aggregator.detectors.stuck_heads import DETECTOR, Examination, Stall, examine_steps
from sentinel.aggregator.state import FleetState, JobView
from sentinel.aggregator.verdicts import Finding
from sentinel.components.ib.rule import PortRuleConfig
from sentinel.components.linkpace.rule import LinkPaceConfig
from sentinel.config.aggregator import AggregatorConfig, HardwareConfig, StuckConfig
from sentinel.log import get_logger

__all__ = [
    "DETECTOR",
    "DumpJudgement",
    "Stall",
    "StuckDetector",
    "evaluate_job_steps",
    "examine_steps",
    "judge_dumps",
]


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.stuck")


#: A stalled job is examined again only when its heads move (``JobView.progress_version``) or time alone can
#: change the answer (:meth:`Examination.valid`); a stall whose heads keep moving without progress (ranks
#: entering and leaving other collectives) is re-examined at most every RECHECK_S when it is this large:
#: examining 24,576 ranks' heads costs ~0.3 s of a core (bench/aggregator.py --engine --jobs). Progress (or
#: the job ending) is seen on the next tick as before: the cheap "no progress for min_wait_s" test runs
#: every tick.
LARGE_JOB_RANKS = 2048
RECHECK_S = 5.0


class StuckDetector(Detector):
    """Per job, every tick; remembers the stalls it saw last (for metrics, incidents and the API)."""

    name = DETECTOR

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self.stalls: dict[str, Stall] = {}
        self.dumps: dict[str, DumpJudgement] = {}  # job → its stall's dump analysis, while the stall lasts
        #: per job, the examination of its heads while it stays valid (see :class:`Examination`)
        self._known: dict[str, Examination] = {}
        #: judgements restored from the store, waiting for their stall to be seen again (until the deadline)
        self._restored: dict[str, _DumpMemory] = {}
        self._restored_until: float | None = None

    def evaluate(self, seen: Observation) -> Evaluation:
        return run_steps(self.evaluate_steps(seen))

    def evaluate_steps(self, seen: Observation) -> Steps[Evaluation]:
        """Sliced: examining a 24,576-rank job's heads afresh took up to 0.75 s in one piece; it yields every
        :data:`ITEMS_PER_STEP` ranks (:func:`examine_steps`)."""
        detect = self.config.detect
        cfg = detect.stuck
        ports = detect.network
        links = detect.link_pace
        findings: list[Finding] = []
        stalls: dict[str, Stall] = {}
        known = self._known
        now = seen.now
        for job in list(seen.fleet.jobs.values()):
            stall: Stall | None
            if now - job.last_progress_at < cfg.min_wait_s:
                known.pop(job.id, None)
                continue
            exam = known.get(job.id)
            if exam is not None and not (exam.valid(job, cfg, now) or self._churning(exam, job, now)):
                exam = None
            if exam is not None:
                found, stall = conclude(exam, job, seen.fleet, cfg, detect.hardware, now, ports, links=links)
            else:
                examined: list[Examination] = []
                found, stall = yield from evaluate_job_steps(
                    job, seen.fleet, cfg, detect.hardware, now, ports, examined, links
                )
                if examined:
                    known[job.id] = examined[0]
                else:
                    known.pop(job.id, None)
            if stall is not None:
                stalls[job.id] = stall
                judged = self.dumps.get(job.id)
                if judged is not None:
                    found = _with_dumps(job, found, judged, stall)
            findings.extend(found)
        if len(known) > len(seen.fleet.jobs):
            self._known = {job: k for job, k in known.items() if job in seen.fleet.jobs}
        self.stalls = stalls
        for job_id in [j for j in self.dumps if j not in stalls]:
            del self.dumps[job_id]  # the stall is over: the next one gets its own dumps
        if self._restored:
            findings = self._claim_restored(seen, findings)
        return Evaluation(findings)

    @staticmethod
    def _churning(exam: Examination, job: JobView, now: float) -> bool:
        """A large stall whose heads moved without progress, examined less than RECHECK_S ago: keep the
        examination (the per-tick work stays bounded whatever the heads do)."""
        return (
            exam.first is not None
            and len(job.ranks) >= LARGE_JOB_RANKS
            and exam.progress_at == job.last_progress_at
            and now - exam.at < RECHECK_S
        )

    def _claim_restored(self, seen: Observation, findings: list[Finding]) -> list[Finding]:
        """Join restored dump judgements to their stall once fresh heads show it again (same group and
        collective); one whose stall is not seen within the restore hold, or is another stall, is dropped."""
        cfg = self.config.detect.stuck
        if self._restored_until is None:
            self._restored_until = (
                seen.now + cfg.min_wait_s + cfg.heads_fresh_s + 2 * self.config.fleet.tick_s
            )
        claimed = []
        for job_id, memory in self._restored.items():
            stall = self.stalls.get(job_id)
            if stall is None or (stall.pg, stall.seq) != (memory.pg, memory.seq):
                continue
            judged = DumpJudgement(memory.outcome, memory.culprits, memory.verdict, memory.findings)
            self.dumps[job_id] = judged
            claimed.append(job_id)
            job = seen.fleet.jobs.get(job_id)
            if job is not None:
                ours = [f for f in findings if f.key[:2] == ("stuck", job_id)]
                rest = [f for f in findings if f.key[:2] != ("stuck", job_id)]
                findings = rest + _with_dumps(job, ours, judged, stall)
        for job_id in claimed:
            del self._restored[job_id]
        if seen.now >= self._restored_until:
            self._restored = {}
        return findings

    def stalled_jobs(self) -> dict[str, Stall]:
        return self.stalls

    def join_dumps(self, job: str, analysis: Mapping[str, Any] | None) -> DumpJudgement | None:
        """The job's dumps were analyzed (an incident's ``fr_dump``): judge the live verdicts with it."""
        stall = self.stalls.get(job)
        if stall is None:
            return None
        judged = self.dumps[job] = judge_dumps(analysis, stall.culprits)
        return judged

    def configure(self, config: AggregatorConfig) -> None:
        super().configure(config)
        self._known.clear()  # new thresholds: examine every stall afresh

    def job_ended(self, job: str) -> None:
        self.stalls.pop(job, None)
        self.dumps.pop(job, None)
        self._known.pop(job, None)

    def snapshot(self) -> dict[str, Any]:
        dumps = {
            job: _DumpMemory(
                outcome=j.outcome,
                culprits=j.culprits,
                verdict=j.verdict,
                findings=j.findings,
                pg=s.pg,
                seq=s.seq,
            )
            for job, j in self.dumps.items()
            if (s := self.stalls.get(job)) is not None
        }
        out: dict[str, Any] = msgspec.to_builtins(StuckMemory(dumps={**self._restored, **dumps}))
        out["stalls"] = {job: asdict(stall) for job, stall in self.stalls.items()}  # for the debug API
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Take back the dump judgements of stalls in progress; the stalls themselves are seen afresh."""
        self.switched_on()
        try:
            memory = msgspec.convert({"dumps": state.get("dumps", {})}, StuckMemory, strict=False)
        except msgspec.ValidationError as exc:
            log().warning("stuck_memory_unreadable", error=str(exc)[:300])
            return
        self._restored = dict(memory.dumps)
        self._restored_until = None


def evaluate_job_steps(  # noqa: PLR0917
    job: JobView,
    fleet: FleetState,
    cfg: StuckConfig,
    hw: HardwareConfig,
    now: float,
    ports: PortRuleConfig | None = None,
    examined: list[Examination] | None = None,
    links: LinkPaceConfig | None = None,
) -> Steps[tuple[list[Finding], Stall | None]]:
    """The culprits of ``job``'s stall, if it is stalled now, with NCCL RAS's view of the job as evidence
    (in steps: :func:`examine_steps`; ``run_steps`` runs them in one piece).

    The rank heads are examined afresh; the examination is appended to ``examined`` (when given) for the
    caller to conclude from again while it stays :meth:`Examination.valid`.
    """
    if now - job.last_progress_at < cfg.min_wait_s:
        return [], None
    exam = yield from examine_steps(job, cfg, now)
    if examined is not None and exam is not None:
        examined.append(exam)
    if exam is None:
        return _from_watchdog(job, fleet, cfg, now)
    return conclude(exam, job, fleet, cfg, hw, now, ports or PortRuleConfig(), links=links)

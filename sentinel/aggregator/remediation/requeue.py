"""Requeue without the culprit: after a drain, the verdict's running Slurm job is requeued, its node excluded.

Once per incident, only for a running batch job that allows requeues, inside its own circuit breaker (sentinel's
requeues within a window, kept in memory and recovered from the audit log at start), dry-run capable. The
outcome is recorded like a drain's (audit log, counter, the verdict's ``remediation`` records) through the
remediator's ``record``. See docs/remediation.md.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sentinel.aggregator.verdicts import Verdict
from sentinel.config.aggregator import RequeueConfig
from sentinel.slurm import CommandOutcome, Slurm, SlurmJob, is_job_id

#: verdicts remembered as requeued (or decided) at most
MAX_TRACKED = 100_000
#: the audit log's tail read at start to recover the requeues of the window
AUDIT_TAIL_BYTES = 4 * 1024 * 1024


class Recorder(Protocol):
    def __call__(
        self, verdict: Verdict, action: str, outcome: str, reason: str, *, node: str, detail: str
    ) -> str: ...


class SlurmJobs(Protocol):
    async def job(self, job_id: str) -> tuple[SlurmJob | None, str]: ...

    async def requeue_excluding(self, job: SlurmJob, node: str) -> CommandOutcome: ...


def requeues_in_audit(path: Path, since: float) -> list[float]:
    """Times of sentinel's done requeues at or after ``since`` in the audit log's tail (unreadable: none)."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - AUDIT_TAIL_BYTES))
            text = handle.read(AUDIT_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    times = []
    for line in text.splitlines():
        if '"requeue"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the cut first line, or a torn one
        if (
            isinstance(record, dict)
            and record.get("action") == "requeue"
            and record.get("outcome") == "done"
            and isinstance(record.get("t"), (int, float))
            and record["t"] >= since
        ):
            times.append(float(record["t"]))
    return sorted(times)


class Requeuer:
    """The requeue step of remediation; ``after_drain`` runs on the remediator's worker, after a drain."""

    def __init__(
        self,
        config: RequeueConfig,
        slurm: SlurmJobs | Slurm,
        record: Recorder,
        *,
        clock: Callable[[], float],
        dry_run: bool,
        leading: Callable[[], bool],
        audit_path: Path | None = None,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.record = record
        self.clock = clock
        self.dry_run = dry_run
        self.leading = leading
        #: incidents (or verdicts) whose requeue is decided (done, dry run, refused for good): never again
        self.decided: OrderedDict[str, None] = OrderedDict()
        #: clock times of sentinel's requeues, the breaker's window
        self.recent: deque[float] = deque()
        if audit_path is not None and config.enabled:
            self.recent.extend(requeues_in_audit(audit_path, clock() - config.window_s))

    def _decide(self, vid: str) -> None:
        self.decided[vid] = None
        while len(self.decided) > MAX_TRACKED:
            self.decided.popitem(last=False)

    @staticmethod
    def key_of(verdict: Verdict) -> str:
        """Once per incident: the verdicts of one incident share its id (no incident: once per verdict)."""
        return verdict.incident or verdict.id

    def wants(self, verdict: Verdict) -> bool:
        return self.config.enabled and bool(verdict.job) and self.key_of(verdict) not in self.decided

    async def after_drain(self, verdict: Verdict, node: str) -> str | None:
        """Requeue the verdict's job without ``node``; the outcome, or None when there is nothing to do."""
        if not self.wants(verdict):
            return None
        job_id = verdict.job or ""
        key = self.key_of(verdict)
        if not is_job_id(job_id):
            self._decide(key)
            return self.record(
                verdict, "requeue", "refused", "not_slurm_job", node=node, detail=f"job {job_id[:64]!r}"
            )
        job, error = await self.slurm.job(job_id)
        if job is None:
            self._decide(key)
            return self.record(verdict, "requeue", "failed", "slurm_unreadable", node=node, detail=error)
        if node in job.excluded:  # Slurm remembers it: requeued without this node before (a restart since)
            self._decide(key)
            return self.record(
                verdict, "requeue", "already", "", node=node, detail=f"job {job_id} already excludes {node}"
            )
        why = (
            "not a batch job"
            if not job.batch
            else "the job does not allow requeues"
            if not job.requeue
            else f"job is {job.state}"
            if job.state != "RUNNING"
            else ""
        )
        if why:
            self._decide(key)
            return self.record(
                verdict, "requeue", "refused", "not_requeueable", node=node, detail=f"job {job_id}: {why}"
            )
        now = self.clock()
        while self.recent and self.recent[0] < now - self.config.window_s:
            self.recent.popleft()
        if len(self.recent) + 1 > self.config.max_requeues:
            self._decide(key)
            return self.record(
                verdict,
                "requeue",
                "refused",
                "breaker_requeues",
                node=node,
                detail=f"{len(self.recent)} jobs requeued by sentinel in the last {self.config.window_s:g} s; "
                f"limit {self.config.max_requeues}",
            )
        excluded = ",".join(dict.fromkeys([*job.excluded, node]))
        if self.dry_run:
            self._decide(key)
            return self.record(
                verdict,
                "requeue",
                "dry_run",
                "",
                node=node,
                detail=f"would requeue job {job_id} with ExcNodeList={excluded}",
            )
        if not self.leading():
            return "follower"
        done = await self.slurm.requeue_excluding(job, node)
        self._decide(key)
        if not done.ok:
            return self.record(verdict, "requeue", "failed", "scontrol_failed", node=node, detail=done.output)
        self.recent.append(now)
        return self.record(
            verdict,
            "requeue",
            "done",
            "",
            node=node,
            detail=f"job {job_id} requeued with ExcNodeList={excluded}",
        )

"""Requeue without the culprit against a real Slurm: after the drain, the verdict's running batch job is
requeued with the node added to its excluded nodes — once, inside the requeue breaker, dry-run capable, in the
audit log and on the verdict — and a requeue that cannot be (an interactive job, a job gone) says why.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sentinel.aggregator.remediation.requeue import requeues_in_audit
from sentinel.aggregator.verdicts import Change, Finding, Verdict, VerdictBook
from sentinel.config.aggregator import RemediationRule, RequeueConfig
from sentinel.slurm import parse_job
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_remediation import remediator

pytestmark = pytest.mark.timeout(120)


def test_parse_job() -> None:
    text = (
        "JobId=42 JobName=train UserId=root(0) JobState=RUNNING Reason=None Requeue=1 Restarts=2 "
        "BatchFlag=1 NodeList=sn[1-2] ExcNodeList=sn9,sn7\n"
    )
    job = parse_job(text)
    assert job is not None
    assert (job.id, job.state, job.batch, job.requeue, job.restarts) == ("42", "RUNNING", True, True, 2)
    assert (job.nodes, job.excluded) == ("sn[1-2]", ("sn9", "sn7"))
    blank = parse_job("JobId=7 JobState=PENDING BatchFlag=0 Requeue=0 NodeList=(null) ExcNodeList=(null)")
    assert blank is not None and (blank.batch, blank.requeue, blank.nodes, blank.excluded) == (
        False,
        False,
        "",
        (),
    )
    assert parse_job("slurm_load_jobs error: Invalid job id specified") is None


def stuck_on(book: VerdictBook, host: str, job: str, rank: int = 1) -> Verdict:
    finding = Finding(
        key=("stuck", job, str(rank)),
        detector="stuck",
        kind="stuck",
        reason="not_entered_collective",
        action="restart_app",
        evidence=("rank 1 has not entered the all_reduce its peers wait in",),
        evidence_t=time.time(),
        host=host,
        gpu=1,
        job=job,
        rank=rank,
    )
    return book.reconcile("stuck", [finding], time.time(), scope=lambda _: False)[0].verdict


def batch_job(slurm: SlurmCluster, node: str, exclude: str = "") -> str:
    argv = ["sbatch", "--parsable", "--requeue", "-N1", "-w", node, "-o", "/dev/null"]
    if exclude:
        argv += ["-x", exclude]
    job = slurm.run(*argv, "--wrap", "sleep 300").strip().split(";")[0]
    deadline = time.monotonic() + 20
    while "JobState=RUNNING" not in slurm.run("scontrol", "show", "job", "-o", job):
        assert time.monotonic() < deadline, slurm.run("scontrol", "show", "job", "-o", job)
        time.sleep(0.2)
    return job


def job_field(slurm: SlurmCluster, job: str, name: str) -> str:
    fields = dict(
        p.split("=", 1) for p in slurm.run("scontrol", "show", "job", "-o", job).split() if "=" in p
    )
    return fields.get(name, "")


STUCK_DRAINS = [RemediationRule(kind="stuck"), RemediationRule(do="none")]


async def test_drain_then_requeue_with_the_node_excluded_once(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = batch_job(idle_slurm, "sn2", exclude="sn4")
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, requeue=RequeueConfig(enabled=True), rules=STUCK_DRAINS)
    v = stuck_on(book, "sn2", job)
    await r.start()
    try:
        r.on_change(Change(v, "opened"))
        await asyncio.wait_for(r.idle.wait(), 30)
        assert [(rec["action"], rec["outcome"]) for rec in v.extra["remediation"]] == [
            ("drain", "done"),
            ("requeue", "done"),
        ]
        # the job keeps what it excluded and gains the drained node; it waits to start again elsewhere
        assert set(job_field(idle_slurm, job, "ExcNodeList").split(",")) == {"sn4", "sn2"}
        assert job_field(idle_slurm, job, "Restarts") == "1"
        assert job_field(idle_slurm, job, "JobState") in ("PENDING", "COMPLETING")
        # once per verdict: the same verdict drained again (already) does not requeue again
        assert await r.drain(v) == "already"
        assert await r.requeuer.after_drain(v, "sn2") is None
        # another verdict on the node the job now excludes: already; a third of that one's incident: nothing
        other = stuck_on(book, "sn2", job, rank=5)
        other.incident = "inc-2"
        assert await r.requeuer.after_drain(other, "sn2") == "already"
        same = stuck_on(book, "sn2", job, rank=0)
        same.incident = "inc-2"
        assert await r.requeuer.after_drain(same, "sn2") is None
        assert job_field(idle_slurm, job, "Restarts") == "1"
        assert job_field(idle_slurm, job, "Restarts") == "1"
    finally:
        await r.stop()
        idle_slurm.run("scancel", job, check=False)
    audit = [rec for rec in r.audit.read() if rec["action"] == "requeue"]
    assert (
        audit[0]["job"] == job and audit[0]["node"] == "sn2" and "ExcNodeList=sn4,sn2" in audit[0]["detail"]
    )
    assert requeues_in_audit(r.audit.path, time.time() - 60) == [audit[0]["t"]]


async def test_dry_run_requeues_nothing(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    job = batch_job(idle_slurm, "sn1")
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, dry_run=True, requeue=RequeueConfig(enabled=True))
    v = stuck_on(book, "sn1", job)
    try:
        assert await r.requeuer.after_drain(v, "sn1") == "dry_run"
        assert job_field(idle_slurm, job, "JobState") == "RUNNING"
        assert job_field(idle_slurm, job, "Restarts") == "0"
        assert v.extra["remediation"][-1]["detail"] == f"would requeue job {job} with ExcNodeList=sn1"
    finally:
        idle_slurm.run("scancel", job, check=False)


async def test_breaker_refuses_past_the_window_limit_and_remembers_across_a_restart(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    jobs = [batch_job(idle_slurm, node) for node in ("sn1", "sn3")]
    cfg = RequeueConfig(enabled=True, max_requeues=1, window_s=600)
    book = VerdictBook()
    try:
        r = remediator(idle_slurm, tmp_path, book, requeue=cfg)
        first = stuck_on(book, "sn1", jobs[0])
        assert await r.requeuer.after_drain(first, "sn1") == "done"
        # a restarted aggregator reads its earlier requeue back from the audit log
        again = remediator(idle_slurm, tmp_path, book, requeue=cfg)
        second = stuck_on(book, "sn3", jobs[1], rank=2)
        assert await again.requeuer.after_drain(second, "sn3") == "refused"
        record = second.extra["remediation"][-1]
        assert record["reason"] == "breaker_requeues" and "1 jobs requeued by sentinel" in record["detail"]
        assert job_field(idle_slurm, jobs[1], "JobState") == "RUNNING"
        assert again.requeuer.recent and await again.requeuer.after_drain(second, "sn3") is None  # decided
    finally:
        for job in jobs:
            idle_slurm.run("scancel", job, check=False)


async def test_what_cannot_be_requeued_says_why(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, requeue=RequeueConfig(enabled=True))
    gone = stuck_on(book, "sn1", "999999")
    assert await r.requeuer.after_drain(gone, "sn1") == "failed"
    assert gone.extra["remediation"][-1]["reason"] == "slurm_unreadable"
    named = stuck_on(book, "sn1", "train-7", rank=3)
    assert await r.requeuer.after_drain(named, "sn1") == "refused"
    assert named.extra["remediation"][-1]["reason"] == "not_slurm_job"
    off = remediator(idle_slurm, tmp_path / "off", VerdictBook())
    assert await off.requeuer.after_drain(stuck_on(VerdictBook(), "sn1", "5"), "sn1") is None

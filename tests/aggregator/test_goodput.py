"""The goodput ledger on a virtual clock: each phase of an incident, the GPU time lost, the metrics, restarts."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from sentinel.aggregator.goodput import GoodputLedger
from sentinel.aggregator.incidents import Incident
from sentinel.aggregator.state import FleetState, JobView, RankView
from sentinel.aggregator.verdicts import Finding, Verdict, VerdictBook
from sentinel.cli.cmd_incident import phases_line


class World:
    def __init__(self) -> None:
        self.t = 1000.0
        self.book = VerdictBook()
        self.fleet = FleetState()
        self.registry = CollectorRegistry()
        self.ledger = GoodputLedger(
            self.book, self.fleet, clock=lambda: self.t, cluster="c", registry=self.registry
        )

    def job(self, job_id: str, ranks: int) -> JobView:
        view = JobView(id=job_id, ranks={r: RankView(rank=r, host="h1") for r in range(ranks)})
        self.fleet.jobs[job_id] = view
        return view

    def open(self, finding: Finding) -> Verdict:
        changes = self.book.reconcile(finding.detector, [finding], self.t, scope=lambda _: False)
        for change in changes:
            self.ledger.on_change(change)
        return changes[0].verdict

    def remediated(self, v: Verdict, action: str, outcome: str = "done", *, dry_run: bool = False) -> None:
        record = {
            "t": self.t,
            "action": action,
            "outcome": outcome,
            "reason": "",
            "node": v.host,
            "detail": "",
        }
        v.extra.setdefault("remediation", []).append(record | {"dry_run": dry_run})

    def tick(self, dt: float = 0.0) -> None:
        self.t += dt
        self.ledger.tick(self.t)

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"cluster": "c", **labels}) or 0.0


def stuck(job: str, host: str = "h2", rank: int | None = 3, evidence_t: float = 0.0) -> Finding:
    return Finding(
        key=("stuck", job, str(rank)),
        detector="stuck",
        kind="stuck",
        reason="not_entered_collective",
        action="restart_app",
        evidence=("rank 3 has not entered the all_reduce",),
        evidence_t=evidence_t,
        host=host,
        gpu=1,
        job=job,
        rank=rank,
    )


def xid(host: str, gpu: int, evidence_t: float) -> Finding:
    return Finding(
        key=("hw", host, str(gpu)),
        detector="hardware",
        kind="faulty",
        reason="xid_79",
        action="reboot",
        evidence=("xid 79",),
        evidence_t=evidence_t,
        host=host,
        gpu=gpu,
    )


def test_every_phase_of_a_requeued_job_and_its_gpu_time() -> None:
    w = World()
    job = w.job("42", ranks=8)
    job.last_progress_at = 990.0
    v = w.open(stuck("42", evidence_t=990.0))  # the stall began at 990, named at 1000
    w.tick(2.0)
    w.remediated(v, "drain")
    w.tick(1.0)
    w.remediated(v, "requeue")
    w.tick(20.0)
    (entry,) = w.ledger.open.values()
    p = entry.phases
    assert (p.fault_at, p.detected_at, p.named_at, p.drained_at, p.requeued_at) == (
        990,
        1000,
        1000,
        1002,
        1003,
    )
    assert p.resumed_at is None and entry.gpu_seconds_lost(w.t) == 8 * (1023 - 990)
    assert w.sample("sentinel_incident_waiting_seconds", step="resume") == 20.0
    # the requeued job's step clock moves again
    job.last_progress_at = w.t + 5
    w.tick(6.0)
    assert not w.ledger.open and entry.phases.resumed_at == 1028 and entry.ended_at == 1028
    assert entry.gpu_seconds_lost(w.t + 1000) == 8 * 38  # ended: no longer grows
    assert w.sample("sentinel_goodput_gpu_hours_lost_total", cause="not_entered_collective") == pytest.approx(
        8 * 38 / 3600
    )
    sums = {
        ph: w.sample("sentinel_incident_phase_seconds_sum", phase=ph)
        for ph in ("detect", "name", "drain", "requeue", "resume")
    }
    assert sums == {"detect": 10, "name": 0, "drain": 2, "requeue": 1, "resume": 25}
    assert w.sample("sentinel_incidents_open") == 0


def test_a_job_that_moves_again_by_itself_resumes_without_remediation() -> None:
    w = World()
    job = w.job("7", ranks=2)
    w.open(stuck("7", evidence_t=995.0))
    w.tick(3.0)
    assert w.ledger.open  # nothing moved yet
    job.last_progress_at = w.t
    w.tick(1.0)
    (entry,) = w.ledger.entries.values()
    assert entry.phases.drained_at is None and entry.phases.resumed_at == 1003
    assert entry.gpu_seconds_lost(w.t) == 2 * 8


def test_a_faulty_gpu_without_a_job_ends_when_its_verdict_closes() -> None:
    w = World()
    v = w.open(xid("h3", 5, evidence_t=997.0))
    w.remediated(v, "drain", dry_run=True)  # a dry run drains nothing
    w.tick(10.0)
    (entry,) = w.ledger.open.values()
    assert entry.phases.drained_at is None and entry.gpus == 1
    assert entry.gpu_seconds_lost(w.t) == 13
    w.book.close(v.key, w.t, "evidence gone")
    w.tick(5.0)
    assert not w.ledger.open and entry.ended_at == 1010 and entry.phases.resumed_at is None
    assert entry.gpu_seconds_lost(w.t) == 13


def test_a_requeued_job_waits_for_its_resumption_after_its_verdict_closed() -> None:
    w = World()
    w.job("9", ranks=4)
    v = w.open(stuck("9"))
    w.remediated(v, "drain")
    w.remediated(v, "requeue")
    w.book.close(v.key, w.t + 1, "job ended")  # the old ranks went away with the requeue
    w.tick(30.0)
    assert w.ledger.open  # still waiting for the job to come back


def test_drain_waiting_is_watched_once_a_drain_was_tried() -> None:
    w = World()
    v = w.open(xid("h4", 0, evidence_t=999.0))
    w.tick(5.0)
    assert w.sample("sentinel_incident_waiting_seconds", step="drain") == 0  # the policy did not act
    w.remediated(v, "drain", "refused")
    w.tick(5.0)
    assert w.sample("sentinel_incident_waiting_seconds", step="drain") == 10


def test_verdicts_of_one_incident_share_an_entry_and_counts_per_node_and_gpu() -> None:
    w = World()
    w.job("5", ranks=4)
    w.open(stuck("5", host="h1", rank=0))
    w.open(stuck("5", host="h1", rank=1))
    assert len(w.ledger.entries) == 1
    (entry,) = w.ledger.entries.values()
    assert len(entry.verdicts) == 2
    w.t += 100
    first = w.open(xid("h1", 1, evidence_t=w.t))
    assert not w.book.reconcile("hardware", [xid("h1", 1, w.t)], w.t, scope=lambda _: False)  # still open
    w.book.close(first.key, w.t + 10, "evidence gone")
    w.tick(10.0)
    w.t += 90
    w.open(xid("h1", 1, evidence_t=w.t))
    assert len(w.ledger.entries) == 3
    assert w.sample("sentinel_incidents_by_node_total", host="h1") == 3
    assert w.sample("sentinel_incidents_by_gpu_total", host="h1", gpu="1") == 3
    # three incidents on h1 GPU 1, at 1000, 1100 and 1200: a mean of 100 s between them
    assert w.sample("sentinel_incident_mtbi_seconds", host="h1", gpu="1") == 100
    assert w.sample("sentinel_incident_mtbi_seconds", host="h1", gpu="") == 100


def test_the_ledger_survives_a_restart() -> None:
    w = World()
    w.job("3", ranks=2)
    v = w.open(stuck("3", evidence_t=999.0))
    w.remediated(v, "drain")
    w.tick(1.0)
    records = {k: d for k, d in w.ledger.snapshot(full=True).items() if d is not None}
    again = World()
    again.ledger.restore(records, again.t)
    (entry,) = again.ledger.open.values()
    assert entry.phases.drained_at == 1000 and entry.verdicts == [v.id]
    assert w.ledger.snapshot() == {}  # nothing changed since


def test_incident_served_with_phases() -> None:
    w = World()
    w.job("11", ranks=2)
    v = w.open(stuck("11", evidence_t=990.0))
    incident = Incident(
        id=v.incident or "x",
        created_at=w.t,
        job="11",
        verdicts=[v.to_dict()],
        hosts=["h2"],
        missing_hosts=[],
        window=(900.0, 1000.0),
        problems=[],
        timeline=[],
    )
    w.t += 10
    doc = msgspec.to_builtins(w.ledger.annotate(incident, w.t))
    assert set(doc["phases"]) == {
        "fault_at",
        "detected_at",
        "named_at",
        "drained_at",
        "requeued_at",
        "resumed_at",
    }
    assert doc["phases"]["fault_at"] == 990 and doc["phases"]["drained_at"] is None
    assert doc["gpu_seconds_lost"] == 2 * 20
    # an incident the ledger does not hold: phases from its verdicts, one GPU
    other = msgspec.structs.replace(incident, id="old", verdicts=[v.to_dict() | {"id": "gone"}])
    assert msgspec.to_builtins(w.ledger.annotate(other, w.t))["phases"]["named_at"] == 1000


def test_incident_cli_prints_the_phases() -> None:
    doc = {
        "phases": {
            "fault_at": 1000.0,
            "detected_at": 1006.0,
            "named_at": 1006.0,
            "drained_at": 1007.5,
            "requeued_at": None,
            "resumed_at": None,
        },
        "gpu_seconds_lost": 7200.0,
    }
    assert phases_line(doc) == (
        "phases: fault 1970-01-01 00:16:40.000Z -> detected +6.0 s -> named +0.0 s -> drained +1.5 s "
        "(not resumed); 2.00 GPU-hours lost"
    )
    assert phases_line({"phases": None}) is None

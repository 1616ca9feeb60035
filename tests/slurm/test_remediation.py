"""Remediation against a real Slurm: the policy, the breaker counted from Slurm's state, idempotent drains,
dry run, someone else's drain, resume only after validation — every outcome in the audit log and the metric.

The remediator is driven directly with verdicts from a real :class:`VerdictBook` (the end-to-end test in
test_slurm_e2e.py drives it through the aggregator from real agents).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sentinel.aggregator.remediation import Remediator, check_breaker, wants_drain
from sentinel.aggregator.remediation.policy import drain_reason_of
from sentinel.aggregator.verdicts import Finding, Verdict, VerdictBook
from sentinel.components.vocab import VerdictKind
from sentinel.config.aggregator import BreakerConfig, RemediationConfig, RemediationRule, ResumeConfig
from sentinel.slurm import MAX_REASON_CHARS, REASON_PREFIX, SlurmNode, drain_reason
from tests.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.timeout(120)
DEFAULT_RULES = RemediationConfig().rules


@pytest.mark.parametrize(
    ("kind", "action", "reason", "drain"),
    [
        ("faulty", "reboot", "xid_79", True),
        ("faulty", "rma", "row_remap_failure", True),
        ("faulty", "reset_gpu", "gpu_unresponsive", True),
        ("faulty", "restart_app", "xid_13", False),
        ("degraded", "drain", "pcie_replays", True),
        ("degraded", "reset_gpu", "nvlink_errors", False),
        ("stuck", "restart_app", "not_entered_collective", False),
        ("straggler", "none", "slow_rank", False),
        ("host_silent", "none", "no_frames", False),
    ],
)
def test_default_policy(kind: str, action: str, reason: str, drain: bool) -> None:
    assert wants_drain(DEFAULT_RULES, kind, action, reason) is drain


def test_policy_first_match_wins_with_globs() -> None:
    rules = [
        RemediationRule(reason="xid_4*", do="none"),
        RemediationRule(kind="faulty"),
        RemediationRule(do="none"),
    ]
    assert not wants_drain(rules, "faulty", "reboot", "xid_48")
    assert wants_drain(rules, "faulty", "reboot", "xid_79")
    assert not wants_drain([], "faulty", "reboot", "xid_79")


def node(name: str, state: str = "idle", reason: str = "", t: float | None = None) -> SlurmNode:
    return SlurmNode(name=name, state=state, reason=reason, reason_user="root", reason_time=t)


def test_breaker_limits() -> None:
    now = 10_000.0
    cfg = BreakerConfig(window_s=600, max_drains=2, max_fraction=0.5, max_unavailable_fraction=0.5)
    fleet = [node(f"n{i}") for i in range(8)]
    assert check_breaker(cfg, fleet, "n0", now).allowed
    # two sentinel drains inside the window: a third passes max_drains
    two = [
        node("n1", "drained", "sentinel: a v1", now - 10),
        node("n2", "draining", "sentinel: b v2", now - 599),
    ]
    check = check_breaker(cfg, two + fleet[3:], "n0", now)
    assert (check.allowed, check.refusal, check.sentinel_drains) == (False, "breaker_sentinel_drains", 2)
    # ...but a drain older than the window no longer counts, and neither does someone else's reason
    old = [
        node("n1", "drained", "sentinel: a v1", now - 601),
        node("n2", "drained", "kernel upgrade", now - 1),
    ]
    assert check_breaker(cfg, old + fleet[3:], "n0", now).allowed
    # a sentinel drain whose time Slurm does not show counts as recent (unknown is not old)
    unknown = [node("n1", "drained", "sentinel: a", None), node("n2", "drained", "sentinel: b", None)]
    assert check_breaker(cfg, unknown + fleet[3:], "n0", now).refusal == "breaker_sentinel_drains"
    # fraction of the partition drained by sentinel
    small = [node("a", "drained", "sentinel: x", now), node("b"), node("c")]
    assert check_breaker(cfg, small, "b", now).refusal == "breaker_sentinel_fraction"
    # the partition's down/drained nodes for any reason
    down = [node(f"d{i}", "down", "Not responding", now - 5000) for i in range(4)] + fleet[:4]
    check = check_breaker(cfg, down, "n0", now)
    assert (check.refusal, check.unavailable, check.nodes) == ("breaker_partition_unavailable", 4, 8)
    assert check_breaker(cfg, [], "n0", now).refusal == "breaker_partition_unavailable"


def verdict(
    book: VerdictBook, host: str, *, kind: VerdictKind = "faulty", reason: str = "xid_79", gpu: int = 3
) -> Verdict:
    finding = Finding(
        key=("hw", host, str(gpu)),
        detector="hardware",
        kind=kind,
        reason=reason,
        action="reboot",
        evidence=("xid_79 (fallen off the bus)",),
        evidence_t=time.time(),
        host=host,
        gpu=gpu,
    )
    return book.reconcile("hardware", [finding], time.time(), scope=lambda _: False)[0].verdict


def remediator(
    slurm: SlurmCluster,
    tmp_path: Path,
    book: VerdictBook,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    **cfg: object,
) -> Remediator:
    config = RemediationConfig(
        enabled=True,
        dry_run=False,
        breaker=BreakerConfig(max_drains=2, max_fraction=1.0, max_unavailable_fraction=0.8),
        command_timeout_s=10.0,
    )
    config = msgspec.structs.replace(config, **cfg)
    return Remediator(
        config,
        book,
        state_dir=tmp_path,
        registry=registry or CollectorRegistry(),
        env=slurm.env(),
        clock=clock,
    )


def metric(r: Remediator, action: str, outcome: str, reason: str = "") -> float:
    assert r.metrics.registry is not None
    labels = {"cluster": r.metrics.cluster, "action": action, "outcome": outcome, "reason": reason}
    return r.metrics.registry.get_sample_value("sentinel_remediation_actions_total", labels) or 0.0


def breaker_open(r: Remediator) -> float | None:
    assert r.metrics.registry is not None
    return r.metrics.registry.get_sample_value(
        "sentinel_remediation_breaker_open", {"cluster": r.metrics.cluster}
    )


async def test_dry_run_drains_nothing_and_logs_what_it_would_do(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, dry_run=True)
    v = verdict(book, "sn1")
    assert await r.drain(v) == "dry_run"
    assert idle_slurm.node_state("sn1")[0] == "IDLE"
    (record,) = r.audit.read()
    assert record["outcome"] == "dry_run" and record["node"] == "sn1" and record["verdict"] == v.id
    assert f"would drain with reason 'sentinel: faulty xid_79 GPU 3 {v.id}'" == record["detail"]
    assert v.to_dict()["remediation"][0]["outcome"] == "dry_run"
    assert metric(r, "drain", "dry_run") == 1


async def test_drain_is_idempotent_across_two_aggregators(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    first_book, second_book = VerdictBook(), VerdictBook(id_prefix="w")
    first = remediator(idle_slurm, tmp_path / "a", first_book)
    second = remediator(idle_slurm, tmp_path / "b", second_book)
    v1, v2 = verdict(first_book, "sn2"), verdict(second_book, "sn2")
    assert await first.drain(v1) == "done"
    state, reason = idle_slurm.node_state("sn2")
    assert "DRAIN" in state and reason == f"sentinel: faulty xid_79 GPU 3 {v1.id}"
    # the second aggregator (its own verdict id for the same GPU) sees Slurm's state and does nothing
    assert await second.drain(v2) == "already"
    assert idle_slurm.node_state("sn2")[1] == reason
    assert metric(second, "drain", "already") == 1 and metric(second, "drain", "done") == 0


async def test_someone_elses_drain_is_not_overwritten(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    idle_slurm.run("scontrol", "update", "nodename=sn3", "state=drain", "reason=kernel upgrade")
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book)
    assert await r.drain(verdict(book, "sn3")) == "refused"
    assert idle_slurm.node_state("sn3")[1] == "kernel upgrade"
    assert r.audit.read()[-1]["reason"] == "not_ours"


async def test_breaker_counts_earlier_drains_from_slurm_and_refuses(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    # two drains by an earlier aggregator (or one that restarted): only Slurm remembers them
    for name in ("sn1", "sn2"):
        idle_slurm.run(
            "scontrol", "update", f"nodename={name}", "state=drain", f"reason=sentinel: faulty xid_79 {name}"
        )
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book)
    v = verdict(book, "sn4")
    assert await r.drain(v) == "refused"
    assert idle_slurm.node_state("sn4")[0] == "IDLE"
    record = r.audit.read()[-1]
    assert record["reason"] == "breaker_sentinel_drains" and "2 drains by sentinel" in record["detail"]
    assert breaker_open(r) == 1
    assert v.id in r.retry  # retried later, while the verdict stays open
    # once an operator resumes one of them, the same verdict passes the breaker
    idle_slurm.run("scontrol", "update", "nodename=sn1", "state=resume")
    assert await r.drain(v) == "done"
    assert breaker_open(r) == 0


async def test_partition_mostly_unavailable_refuses(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    for name in ("sn1", "sn2"):
        idle_slurm.run("scontrol", "update", f"nodename={name}", "state=drain", "reason=maintenance")
    book = VerdictBook()
    cfg = BreakerConfig(max_drains=10, max_fraction=1.0, max_unavailable_fraction=0.5)
    r = remediator(idle_slurm, tmp_path, book, breaker=cfg)
    assert await r.drain(verdict(book, "sn3")) == "refused"
    assert r.audit.read()[-1]["reason"] == "breaker_partition_unavailable"


async def test_unknown_node_and_unreachable_slurm_fail_without_acting(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, node_name="{host}-missing")
    assert await r.drain(verdict(book, "sn1")) == "failed"
    assert r.audit.read()[-1]["reason"] == "unknown_node"
    broken = remediator(idle_slurm, tmp_path / "b", book, sinfo="/nonexistent/sinfo")
    assert await broken.drain(verdict(book, "sn2", gpu=1)) == "failed"
    assert broken.audit.read()[-1]["reason"] == "slurm_unreadable"


async def test_resume_only_after_real_evidence_and_validation(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    book = VerdictBook()
    flag = tmp_path / "validation-ok"
    resume = ResumeConfig(
        enabled=True, validation_command=["test", "-e", str(flag), "-a", "{node}", "=", "sn4"]
    )
    r = remediator(idle_slurm, tmp_path, book, resume=resume)
    v = verdict(book, "sn4")
    assert await r.drain(v) == "done"
    book.close(v.key, time.time(), "evidence gone")  # e.g. the GPU was reset and the agent reports it clean
    assert await r.resume(v) == "refused"  # the validation command fails: the node stays drained
    assert r.audit.read()[-1]["reason"] == "validation_failed"
    assert "DRAIN" in idle_slurm.node_state("sn4")[0]
    flag.touch()
    assert await r.resume(v) == "done"
    assert "DRAIN" not in idle_slurm.node_state("sn4")[0]
    # a verdict that closed because its job ended is no evidence of a repair
    v2 = verdict(book, "sn4", gpu=5)
    assert await r.drain(v2) == "done"
    book.close(v2.key, time.time(), "job ended")
    assert await r.resume(v2) == "refused" and r.audit.read()[-1]["reason"] == "not_repaired"


async def test_resume_never_lifts_someone_elses_drain(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, resume=ResumeConfig(enabled=True, validation_command=["true"]))
    v = verdict(book, "sn3")
    assert await r.drain(v) == "done"
    idle_slurm.run("scontrol", "update", "nodename=sn3", "state=drain", "reason=operator: bad DIMM")
    book.close(v.key, time.time(), "evidence gone")
    assert await r.resume(v) == "refused" and r.audit.read()[-1]["reason"] == "not_ours"
    assert idle_slurm.node_state("sn3")[1] == "operator: bad DIMM"


async def test_verdict_changes_queue_work_once(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    """Through the engine's listener interface: opened → one drain; updates of a settled verdict → nothing."""
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book)
    await r.start()
    try:
        finding = dataclasses.replace(hw_finding("sn1", gpu=0), evidence=("a",))
        for change in book.reconcile("hardware", [finding], time.time()):
            r.on_change(change)
        await asyncio.wait_for(r.idle.wait(), 20)
        updated = dataclasses.replace(finding, evidence=("a", "b"))
        for change in book.reconcile("hardware", [updated], time.time()):
            r.on_change(change)
        await asyncio.wait_for(r.idle.wait(), 20)
    finally:
        await r.stop()
    assert [rec["outcome"] for rec in r.audit.read()] == ["done"]
    assert "DRAIN" in idle_slurm.node_state("sn1")[0]


async def test_open_verdicts_at_start_are_looked_at_once(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    """Verdicts restored from durable state open no change: the remediator looks at them when it starts —
    one already drained by sentinel (before the restart) is ``already``, the other one is drained now."""
    book = VerdictBook()
    before, pending = verdict(book, "sn1"), verdict(book, "sn2", gpu=2)
    idle_slurm.run(
        "scontrol", "update", "nodename=sn1", "state=drain", f"reason=sentinel: faulty xid_79 {before.id}"
    )
    r = remediator(idle_slurm, tmp_path, book)
    await r.start()
    try:
        await asyncio.wait_for(r.idle.wait(), 20)
    finally:
        await r.stop()
    outcomes = {rec["node"]: rec["outcome"] for rec in r.audit.read()}
    assert outcomes == {"sn1": "already", "sn2": "done"}
    assert "DRAIN" in idle_slurm.node_state("sn2")[0] and pending.id in idle_slurm.node_state("sn2")[1]


class Clock:
    """Wall time that moves only when the test says (the lease's expiry is decided on it)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def hw_finding(host: str, gpu: int = 3) -> Finding:
    return Finding(
        key=("hw", host, str(gpu)),
        detector="hardware",
        kind="faulty",
        reason="xid_79",
        action="reboot",
        evidence=("xid_79 (fallen off the bus)",),
        evidence_t=time.time(),
        host=host,
        gpu=gpu,
    )


def open_on(book: VerdictBook, r: Remediator, *findings: Finding) -> None:
    """The engine's path: reconcile the findings into the book and hand every change to the listener."""
    for change in book.reconcile("hardware", list(findings), time.time()):
        r.on_change(change)


def outcomes(r: Remediator) -> list[tuple[str, str]]:
    return [(rec["node"], rec["outcome"]) for rec in r.audit.read()]


async def test_two_aggregators_with_a_lease_act_once_and_the_follower_takes_over(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Two aggregators reach the same verdict at the same instant: only the lease holder drains. The holder
    crashes (hands nothing back); once its lease has run out (plus the command deadline) the follower takes
    over: the drain the dead one did is ``already``, the verdict it never got to is drained. The restarted
    one follows; a clean stop hands the lease back at once."""
    clock = Clock()
    lease = tmp_path / "lease.json"
    ha: dict[str, Any] = {"lease_file": str(lease), "lease_s": 15.0, "command_timeout_s": 10.0}
    book_a, book_b = VerdictBook(), VerdictBook(id_prefix="w")
    a = remediator(idle_slurm, tmp_path / "a", book_a, clock=clock, lease_holder="agg-a", **ha)
    b = remediator(idle_slurm, tmp_path / "b", book_b, clock=clock, lease_holder="agg-b", **ha)
    await a.start()
    await b.start()
    a_back: Remediator | None = None
    try:
        assert a.leading and not b.leading
        assert metric_value(a, "sentinel_remediation_leader") == 1
        assert metric_value(b, "sentinel_remediation_leader") == 0
        open_on(book_a, a, hw_finding("sn1"))
        open_on(book_b, b, hw_finding("sn1"))
        await asyncio.wait_for(a.idle.wait(), 20)
        await asyncio.wait_for(b.idle.wait(), 20)
        assert outcomes(a) == [("sn1", "done")] and outcomes(b) == []
        (va,) = book_a.open.values()
        assert idle_slurm.node_state("sn1")[1] == f"sentinel: faulty xid_79 GPU 3 {va.id}"
        # the follower's own drain call does nothing either (it never reads nor writes Slurm)
        (vb,) = book_b.open.values()
        assert await b.drain(vb) == "follower"

        await a.stop(release=False)  # A crashes holding the lease
        open_on(book_b, b, hw_finding("sn1"), hw_finding("sn2", gpu=1))  # a new fault while A is gone
        await asyncio.wait_for(b.idle.wait(), 20)
        assert outcomes(b) == [] and idle_slurm.node_state("sn2")[0] == "IDLE"
        clock.t += 15.0 + 10.0 - 1.0  # A's lease has run out, but a command it started may still run
        assert not await b.renew()
        clock.t += 2.0
        assert await b.renew()  # B takes over and looks at every open verdict once
        await asyncio.wait_for(b.idle.wait(), 20)
        assert sorted(outcomes(b)) == [("sn1", "already"), ("sn2", "done")]
        (vb2,) = [v for v in book_b.open.values() if v.host == "sn2"]
        assert vb2.id in idle_slurm.node_state("sn2")[1]
        assert json.loads(lease.read_text())["holder"] == "agg-b"

        a_back = remediator(idle_slurm, tmp_path / "a", book_a, clock=clock, lease_holder="agg-a", **ha)
        await a_back.start()  # A restarts: B holds the lease, so A follows and repeats nothing
        await asyncio.wait_for(a_back.idle.wait(), 20)
        assert not a_back.leading and outcomes(a_back) == [("sn1", "done")]  # its old record, nothing new

        await b.stop()  # a clean stop hands the lease back: A leads at its next renewal, no waiting
        assert await a_back.renew()
    finally:
        for r in (a, b, a_back):
            if r is not None:
                await r.stop()


async def test_an_unusable_lease_file_means_not_acting(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    book = VerdictBook()
    missing_dir = tmp_path / "not-mounted" / "lease.json"
    r = remediator(idle_slurm, tmp_path, book, lease_file=str(missing_dir))
    await r.start()
    try:
        open_on(book, r, hw_finding("sn4"))
        await asyncio.wait_for(r.idle.wait(), 20)
    finally:
        await r.stop()
    assert not r.leading and outcomes(r) == [] and idle_slurm.node_state("sn4")[0] == "IDLE"
    assert metric_value(r, "sentinel_remediation_lease_errors_total") == 1
    assert metric_value(r, "sentinel_remediation_leader") == 0


def metric_value(r: Remediator, name: str) -> float | None:
    assert r.metrics.registry is not None
    return r.metrics.registry.get_sample_value(name, {"cluster": r.metrics.cluster})


@settings(max_examples=300, deadline=None)
@given(
    job=st.text(max_size=1000),
    rank=st.none() | st.integers(0, 1 << 24),
    gpu=st.none() | st.integers(0, 1023),
    reason=st.text(min_size=1, max_size=64),
)
def test_the_verdict_id_always_survives_the_drain_reason(
    job: str, rank: int | None, gpu: int | None, reason: str
) -> None:
    """Whatever job id an agent reported (any length, spaces, newlines, another verdict's id), the reason
    sentinel sets fits Slurm's bound and ends with the whole verdict id, which resume and on-call look for."""
    v = Verdict(
        id="v123456",
        key=("stuck", job, "0"),
        detector="stuck",
        kind="stuck",
        reason=reason,
        action="restart_app",
        host="sn1",
        gpu=gpu,
        job=job,
        rank=rank,
        evidence=[],
        opened_at=0.0,
        evidence_t=0.0,
        updated_at=0.0,
    )
    text = drain_reason_of(v)
    assert len(text) <= MAX_REASON_CHARS and text.startswith(REASON_PREFIX)
    assert drain_reason(text) == text  # what scontrol is given is this, unchanged
    words = text.split()
    assert words[-1] == v.id
    if job and len(job) < 100:  # a job id that fits is shown whole, as one word
        at = -2 - (2 if rank is not None else 0)  # [..., "job", job, ("rank", r), id]
        assert words[at - 1 : at + 1] == ["job", "".join(c if "!" <= c <= "~" else "_" for c in job)]


async def test_a_long_job_id_never_pushes_the_verdict_id_out_of_slurms_reason(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    book = VerdictBook()
    (flag := tmp_path / "validated").touch()
    resume = ResumeConfig(enabled=True, validation_command=["test", "-e", str(flag)])
    r = remediator(idle_slurm, tmp_path, book, resume=resume)
    job = "array-" + "9" * 300 + " v000001"
    finding = dataclasses.replace(hw_finding("sn3", gpu=6), job=job, rank=12345)
    v = book.reconcile("hardware", [finding], time.time(), scope=lambda _: False)[0].verdict
    assert await r.drain(v) == "done"
    state, reason = idle_slurm.node_state("sn3")
    assert "DRAIN" in state and len(reason) <= MAX_REASON_CHARS
    assert reason.startswith("sentinel: faulty xid_79 GPU 6 job array-999") and reason.endswith(
        f"... rank 12345 {v.id}"
    )
    book.close(v.key, time.time(), "evidence gone")
    assert await r.resume(v) == "done"  # it finds its verdict id as the reason's last word


def test_breaker_counts_re_drains_of_the_same_node() -> None:
    """Slurm shows a resumed node as idle: only the drains sentinel did remember that it was drained twice."""
    now = 10_000.0
    cfg = BreakerConfig(window_s=600, max_drains=2, max_fraction=1.0, max_unavailable_fraction=1.0)
    fleet = [node(f"n{i}") for i in range(8)]
    done = [("n0", now - 100), ("n0", now - 50)]  # n0 drained, resumed, drained, resumed
    check = check_breaker(cfg, fleet, "n0", now, done)
    assert (check.allowed, check.refusal, check.sentinel_drains) == (False, "breaker_sentinel_drains", 2)
    assert check_breaker(cfg, fleet, "n0", now + 551, done).allowed  # the first one left the window
    # a drain still shown by Slurm and remembered is one drain, not two
    still = [node("n1", "drained", "sentinel: a v1", now - 10), *fleet[2:]]
    assert check_breaker(cfg, still, "n0", now, [("n1", now - 10)]).sentinel_drains == 1


async def test_a_flapping_gpu_is_held_down_and_the_breaker_counts_every_re_drain(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    """A GPU whose Xid returns after every reset: each reset closes the verdict with real evidence and the
    node is resumed; each return drains it again. After ``hold_down_drains`` drains of the same GPU and
    reason within the window the node stays drained, and says why; on the virtual clock, well inside the
    window."""
    clock = Clock()
    registry = CollectorRegistry()
    resume = ResumeConfig(
        enabled=True, validation_command=["true"], hold_down_drains=3, hold_down_window_s=3600.0
    )
    book = VerdictBook()
    r = remediator(
        idle_slurm,
        tmp_path,
        book,
        registry=registry,
        clock=clock,
        resume=resume,
        breaker=BreakerConfig(max_drains=10, max_fraction=1.0, max_unavailable_fraction=1.0),
    )
    outcomes: list[tuple[str, str]] = []
    for _ in range(3):
        v = verdict(book, "sn2")
        outcomes.append(("drain", await r.drain(v)))
        clock.t += 30.0  # the GPU is reset: the verdict closes on real evidence
        book.close(v.key, clock.t, "evidence gone")
        outcomes.append(("resume", await r.resume(v)))
        clock.t += 30.0  # ...and the Xid returns
    assert outcomes == [
        ("drain", "done"),
        ("resume", "done"),
        ("drain", "done"),
        ("resume", "done"),
        ("drain", "done"),
        ("resume", "refused"),
    ]
    assert "DRAIN" in idle_slurm.node_state("sn2")[0]  # held down: it stays drained
    record = r.audit.read()[-1]
    assert (record["action"], record["reason"]) == ("resume", "held_down")
    assert "drained 3 times for GPU 3 xid_79" in record["detail"]
    assert v.extra["held_down"]["drains"] == 3 and v.extra["held_down"]["node"] == "sn2"
    assert any("held down" in line for line in v.evidence)
    assert registry.get_sample_value("sentinel_remediation_held_down_nodes", {"cluster": "default"}) == 1
    assert metric(r, "resume", "refused", "held_down") == 1
    # once the window has passed without a drain of that GPU, the hold lapses
    clock.t += 3600.0
    r.tick(clock.t)
    assert registry.get_sample_value("sentinel_remediation_held_down_nodes", {"cluster": "default"}) == 0


async def test_the_breaker_stops_a_flapping_node_that_slurm_shows_as_idle(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Without hold-down the breaker alone bounds the flapping: each re-drain counts."""
    clock = Clock()
    resume = ResumeConfig(enabled=True, validation_command=["true"], hold_down_drains=0)
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, clock=clock, resume=resume)  # breaker: max_drains=2
    got = []
    for _ in range(3):
        v = verdict(book, "sn3")
        got.append(await r.drain(v))
        clock.t += 10.0
        book.close(v.key, clock.t, "evidence gone")
        if got[-1] == "done":
            assert await r.resume(v) == "done"
    assert got == ["done", "done", "refused"]
    assert r.audit.read()[-1]["reason"] == "breaker_sentinel_drains"
    assert "DRAIN" not in idle_slurm.node_state("sn3")[0]

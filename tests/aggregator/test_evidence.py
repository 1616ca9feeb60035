"""Evidence before action on the aggregator: who is asked for what, answers kept per host as sent over the
wire, the incident saved with them, and drains of the incident's hosts held until then (or the deadline)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.evidence import EvidenceGate, gather
from sentinel.aggregator.incidents import IncidentManager, IncidentStore
from sentinel.aggregator.remediation import Remediator
from sentinel.aggregator.state import JobView, RankView
from sentinel.aggregator.verdicts import Change, Verdict
from sentinel.cli import main as cli_main
from sentinel.config.aggregator import AggregatorConfig, BreakerConfig, IncidentsConfig, RemediationConfig
from sentinel.wire import (
    Command,
    CommandResult,
    EvidenceAnswer,
    EvidenceRequest,
    RankStack,
    Snapshot,
    StackFrame,
    ThreadStack,
    decode_agent_frame,
    encode,
)

CONFIG = IncidentsConfig(snapshot_timeout_s=2.0, evidence_timeout_s=2.0, evidence_window_s=30.0)


def verdict(now: float, *, host: str = "host-b", kind: str = "faulty", gpu: int = 1) -> Verdict:
    return Verdict(
        id="v-1",
        key=(kind, host, str(gpu)),
        detector="hardware",
        kind=kind,  # type: ignore[arg-type]
        reason="xid_79",
        action="reboot",
        host=host,
        gpu=gpu,
        job="job-1",
        rank=3,
        evidence=["xid 79"],
        opened_at=now,
        evidence_t=now - 5.0,
        updated_at=now,
    )


def over_the_wire(result: CommandResult) -> CommandResult:
    decoded = decode_agent_frame(encode(result))
    assert isinstance(decoded, CommandResult)
    return decoded


def stack_answer(host: str, rank: int) -> EvidenceAnswer:
    frame = StackFrame(name="all_reduce", file="torch/distributed/distributed_c10d.py", line=2501)
    return EvidenceAnswer(
        host=host,
        t=1.0,
        stacks=[
            RankStack(
                pid=100 + rank, gpu=rank % 2, job="job-1", rank=rank, threads=[ThreadStack(frames=[frame])]
            )
        ],
    )


async def test_each_host_is_asked_for_its_share_and_answers_are_kept_per_host() -> None:
    asked: dict[str, EvidenceRequest] = {}

    async def requester(host: str, command: Command, timeout: float) -> CommandResult | None:
        assert isinstance(command.request, EvidenceRequest)
        asked[host] = command.request
        if host == "host-c":
            return None  # silent
        if host == "host-d":
            return over_the_wire(CommandResult(id=command.id, answer=Snapshot(host=host, window=(0.0, 1.0))))
        claimed = "someone-else" if host == "host-a" else host
        return over_the_wire(CommandResult(id=command.id, answer=stack_answer(claimed, 2)))

    now = time.time()
    v = verdict(now)
    hosts = ["host-b", "host-a", "host-c", "host-d"]
    report = await gather(requester, "inc-1", v, hosts, CONFIG, max_answer_bytes=100_000)
    assert asked["host-b"].gpus == [1] and asked["host-a"].gpus == []  # the faulty GPU on its own host only
    assert {r.job for r in asked.values()} == {"job-1"}
    assert {r.fault_t for r in asked.values()} == {v.evidence_t}
    assert {r.window_s for r in asked.values()} == {30.0}
    assert {r.max_bytes for r in asked.values()} == {100_000}  # what fits one frame
    assert sorted(report.hosts) == ["host-a", "host-b"]
    assert report.hosts["host-a"]["host"] == "host-a"  # kept as the host that answered, whatever it claims
    assert report.hosts["host-b"]["stacks"][0]["threads"][0]["frames"][0]["name"] == "all_reduce"
    assert report.missing_hosts == ["host-c"]
    assert any("host-a" in p and "someone-else" in p for p in report.problems)
    assert any("host-d" in p and "Snapshot" in p for p in report.problems)


def manager(tmp_path: Path, release: asyncio.Event) -> IncidentManager:
    engine = Engine(AggregatorConfig())
    job = engine.fleet.jobs["job-1"] = JobView(id="job-1", world_size=4)
    for rank, host in enumerate(("host-a", "host-a", "host-b", "host-b")):
        job.ranks[rank] = RankView(rank=rank, host=host, gpu=rank % 2)

    async def requester(host: str, command: Command, timeout: float) -> CommandResult | None:
        if command.name == "snapshot":
            return CommandResult(id=command.id, answer=Snapshot(host=host, window=(0.0, 1.0)))
        if command.name == "evidence":
            await release.wait()
            return over_the_wire(CommandResult(id=command.id, answer=stack_answer(host, 2)))
        return None

    return IncidentManager(engine, IncidentStore(tmp_path), requester, CONFIG, fr_dumps=None)


async def test_a_drain_of_the_incidents_hosts_waits_until_the_evidence_is_attached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = asyncio.Event()
    m = manager(tmp_path, release)
    v = verdict(time.time())
    m.on_change(Change(verdict=v, what="opened"))
    assert v.incident is not None
    other_host = verdict(time.time(), host="host-z")
    other_host.incident = None
    assert m.evidence_gate.holding(v) == [v.incident]
    assert m.evidence_gate.holding(other_host) == []

    seen_at_drain: list[object] = []

    async def drain() -> None:
        await m.evidence_gate.wait(v)
        incident = m.get(v.incident or "")
        seen_at_drain.append(incident.evidence if incident is not None else None)

    drainer = asyncio.create_task(drain())
    await m.evidence_gate.wait(other_host)  # another host's drain goes ahead at once
    for _ in range(20):
        await asyncio.sleep(0)
    assert not drainer.done()
    release.set()
    await asyncio.wait_for(drainer, 10)
    (evidence,) = seen_at_drain
    assert evidence is not None
    stored = m.get(v.incident)
    assert stored is not None and stored.evidence is not None
    assert sorted(stored.evidence.hosts) == ["host-a", "host-b"] and stored.evidence.state == "done"
    doc = msgspec.to_builtins(stored)
    assert doc["evidence"]["hosts"]["host-b"]["stacks"][0]["rank"] == 2  # as GET /api/v1/incidents/{id}
    await m.drain()
    assert cli_main(["incident", "--state-dir", str(tmp_path), "show", v.incident]) == 0
    out = capsys.readouterr().out
    assert "evidence: done, from 2 host(s)" in out
    assert "rank 2 pid 102 gpu 0 thread 0: all_reduce (torch/distributed/distributed_c10d.py:2501)" in out


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_gate_holds_no_longer_than_its_deadline() -> None:
    clock = Clock()
    gate = EvidenceGate(clock)
    v = verdict(0.0)
    v.incident = "inc-9"
    gate.open("inc-9", ["host-b"], 5.0)
    assert gate.holding(v) == ["inc-9"]
    clock.now += 6.0
    assert gate.holding(v) == []
    await asyncio.wait_for(gate.wait(v), 1.0)  # past its deadline: returns at once


async def test_evidence_off_holds_nothing(tmp_path: Path) -> None:
    m = manager(tmp_path, asyncio.Event())
    m.config = msgspec.structs.replace(CONFIG, evidence=False)
    v = verdict(time.time())
    m.on_change(Change(verdict=v, what="opened"))
    assert m.evidence_gate.holding(v) == []
    await m.drain()
    stored = m.get(v.incident or "")
    assert stored is not None and stored.evidence is None


async def test_the_remediator_drains_only_after_the_gate_lets_it(tmp_path: Path) -> None:
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\nprintf 'host-b\\037idle\\037unknown\\037unknown\\037none\\n'\n")
    sinfo.chmod(0o755)
    config = RemediationConfig(
        enabled=True,
        dry_run=True,
        sinfo=str(sinfo),
        scontrol="/bin/false",
        breaker=BreakerConfig(max_drains=10, max_fraction=1.0, max_unavailable_fraction=1.0),
    )
    gate = EvidenceGate()
    engine = Engine(AggregatorConfig())
    r = Remediator(config, engine.book, state_dir=tmp_path, before_drain=gate.wait)
    v = verdict(time.time())
    v.incident = "inc-1"
    gate.open("inc-1", ["host-b"], 30.0)
    drain = asyncio.create_task(r.drain(v))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not drain.done() and r.audit.read() == []
    gate.settle("inc-1")
    assert await asyncio.wait_for(drain, 20) == "dry_run"
    (record,) = r.audit.read()
    assert record["outcome"] == "dry_run" and record["node"] == "host-b"

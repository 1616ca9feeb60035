"""Xid storms through the real engine: one job's GPUs reporting application or sympathetic Xids within seconds
are one informational verdict naming the origin and one incident counting the GPUs and hosts, never a faulty
verdict per GPU; a real fault at the origin stays that GPU's fault."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.incidents import IncidentManager, IncidentStore
from sentinel.aggregator.remediation.policy import wants_drain
from sentinel.aggregator.verdicts import Change
from sentinel.components.xid.parse import parse_xid
from sentinel.config.aggregator import AggregatorConfig, IncidentsConfig, RemediationConfig
from sentinel.wire import Batch, Command, CommandResult, ProcInfo, Snapshot, XidOccurred
from tests.aggregator.helpers import hello, sample

T0 = 1_000.0


def xid(gpu: int, code: int, t: float, detail: str = "simulated error") -> XidOccurred:
    record = parse_xid(
        f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): {code}, pid={4000 + gpu}, name=python, {detail}"
    )
    assert record is not None
    return XidOccurred(t=t, source="kmsg", gpu=gpu, severity=record.severity, text="", record=record)


def engine_with_job(hosts: list[str]) -> tuple[Engine, dict[str, object]]:
    """Hosts of 8 GPUs each, every GPU running a rank of job ``train``."""
    engine = Engine(AggregatorConfig())
    views: dict[str, object] = {}
    for h, name in enumerate(hosts):
        view = engine.hello(hello(name), T0)
        procs = [ProcInfo(gpu=g, pid=4000 + g, job_id="train", rank=h * 8 + g) for g in range(8)]
        engine.ingest(view, Batch(seq=1, t=T0, samples=[sample(g, T0) for g in range(8)], procs=procs), T0)
        views[name] = view
    engine.tick(T0)
    return engine, views


def send(
    engine: Engine, views: dict[str, object], host: str, seq: int, t: float, events: list[XidOccurred]
) -> None:
    engine.ingest(views[host], Batch(seq=seq, t=t, samples=[], events=list(events)), t)  # type: ignore[arg-type]


async def snapshot(host: str, command: Command, timeout: float) -> CommandResult | None:
    """An agent's answer to the incident's snapshot request: an empty ring."""
    return CommandResult(id=command.id, answer=Snapshot(host=host, window=(0.0, 1.0)))


def incidents(engine: Engine, state_dir: Path) -> IncidentManager:
    """The incident manager on ``engine``'s verdicts, its agents answering with empty rings."""
    manager = IncidentManager(
        engine, IncidentStore(state_dir), snapshot, IncidentsConfig(evidence=False), clock=lambda: T0 + 3
    )
    engine.listeners.append(manager.on_change)
    return manager


def test_a_teardown_storm_is_one_informational_verdict_naming_its_first_gpu() -> None:
    hosts = ["host-a", "host-b", "host-c"]
    engine, views = engine_with_job(hosts)
    changes: list[Change] = []
    engine.listeners.append(changes.append)
    for h, name in enumerate(hosts):  # host by host, GPU by GPU, within 2.4 s; host-a GPU 0 first
        send(engine, views, name, 2, T0 + 1 + h, [xid(g, 45, T0 + 1 + h + g / 10) for g in range(8)])
    engine.tick(T0 + 4)
    opened = [c.verdict for c in changes if c.what == "opened"]
    assert [(v.kind, v.reason, v.action, v.host, v.gpu, v.job) for v in opened] == [
        ("degraded", "xid_storm", "none", "host-a", 0, "train")
    ]
    evidence = opened[0].evidence
    assert "24 reports from 24 GPUs on 3 hosts" in evidence[0] and "Xid 45 x24" in evidence[0]
    assert evidence[1].startswith("origin: host-a GPU 0, Xid 45")
    # no remediation: the default policy leaves an informational verdict alone
    rules = RemediationConfig().rules
    assert not wants_drain(rules, opened[0].kind, opened[0].action, opened[0].reason)
    # quiet for longer than the window: the storm is over and its verdict closes
    engine.tick(T0 + 30)
    storm_changes = [c.what for c in changes if c.verdict.reason == "xid_storm"]
    assert storm_changes.count("opened") == 1 and storm_changes[-1] == "closed"
    assert not [c for c in changes if c.verdict.kind == "faulty"]
    assert not [v for v in engine.verdicts("open") if v.reason == "xid_storm"]


def test_a_real_fault_first_stays_its_gpus_fault_and_the_echoes_are_not_judged() -> None:
    engine, views = engine_with_job(["host-a", "host-b"])
    send(engine, views, "host-a", 2, T0 + 1, [xid(3, 95, T0 + 1, "Uncontained memory error")])
    send(engine, views, "host-a", 3, T0 + 2, [xid(g, 95, T0 + 1.5) for g in range(8) if g != 3])
    send(engine, views, "host-b", 2, T0 + 2, [xid(g, 45, T0 + 1.8) for g in range(8)])
    engine.tick(T0 + 3)
    open_ = engine.verdicts("open")
    faulty = [(v.host, v.gpu, v.reason) for v in open_ if v.kind == "faulty"]
    assert faulty == [("host-a", 3, "xid_95")]
    (storm,) = [v for v in open_ if v.reason == "xid_storm"]
    assert (storm.host, storm.gpu) == ("host-a", 3)
    assert "origin: host-a GPU 3, Xid 95" in storm.evidence[1]
    # an echo is noted on its GPU, not judged: no verdict, no repeat counted towards a suspect state
    echo = engine.fleet.gpu("host-a", 5)
    assert echo is not None and echo.memory["xid"].state == "ok" and echo.memory["xid"].sympathetic == 1


def test_another_hosts_earlier_error_cannot_silence_an_uncontained_error_here() -> None:
    """host-b claims an Xid 79 first; host-a's own Xid 95 a second later is still host-a's verdict."""
    engine, views = engine_with_job(["host-a", "host-b"])
    send(engine, views, "host-b", 2, T0 + 1, [xid(0, 79, T0 + 1, "GPU has fallen off the bus.")])
    send(engine, views, "host-a", 2, T0 + 2, [xid(2, 95, T0 + 2, "Uncontained memory error")])
    engine.tick(T0 + 3)
    faulty = sorted((v.host, v.gpu, v.reason) for v in engine.verdicts("open") if v.kind == "faulty")
    assert faulty == [("host-a", 2, "xid_95"), ("host-b", 0, "xid_79")]


def test_a_stronger_error_later_in_the_burst_becomes_the_origin() -> None:
    """The first report is a teardown's Xid 45; the GPU that fell off the bus (79) is the origin."""
    engine, views = engine_with_job(["host-a"])
    send(engine, views, "host-a", 2, T0 + 1, [xid(g, 45, T0 + 1 + g / 10) for g in range(6)])
    send(engine, views, "host-a", 3, T0 + 2, [xid(6, 79, T0 + 1.7, "GPU has fallen off the bus.")])
    engine.tick(T0 + 3)
    (storm,) = [v for v in engine.verdicts("open") if v.reason == "xid_storm"]
    assert (storm.host, storm.gpu) == ("host-a", 6)
    assert [(v.gpu, v.reason) for v in engine.verdicts("open") if v.kind == "faulty"] == [(6, "xid_79")]


def test_a_non_sympathetic_error_on_another_gpu_is_still_judged() -> None:
    engine, views = engine_with_job(["host-a"])
    send(engine, views, "host-a", 2, T0 + 1, [xid(0, 95, T0 + 1), xid(1, 48, T0 + 1.2, "DBE")])
    engine.tick(T0 + 2)
    assert sorted((v.gpu, v.reason) for v in engine.verdicts("open") if v.kind == "faulty") == [
        (0, "xid_95"),
        (1, "xid_48"),
    ]


def test_reports_further_apart_than_the_window_are_separate_bursts() -> None:
    engine, views = engine_with_job(["host-a"])
    window = AggregatorConfig().detect.xid.storm_window_s
    events = [xid(g, 13, T0 + 1 + g * (window + 1)) for g in range(6)]
    for seq, event in enumerate(events, start=2):
        send(engine, views, "host-a", seq, event.t, [event])
        engine.tick(event.t)
    assert not [v for v in engine.book.all() if v.reason == "xid_storm"]


def test_a_storm_is_one_incident_with_its_origin_and_reach(tmp_path: Path) -> None:
    engine, views = engine_with_job(["host-a", "host-b"])

    async def run() -> None:
        manager = incidents(engine, tmp_path)
        send(engine, views, "host-a", 2, T0 + 1, [xid(g, 45, T0 + 1 + g / 10) for g in range(8)])
        send(engine, views, "host-b", 2, T0 + 2, [xid(g, 45, T0 + 1.9 + g / 10) for g in range(8)])
        engine.tick(T0 + 3)
        engine.tick(T0 + 4)
        await asyncio.gather(*manager.tasks)
        (listed,) = manager.list()  # GET /api/v1/incidents: the origin and the storm's reach
        assert (listed["reason"], listed["job"], listed["host"], listed["gpu"]) == (
            "xid_storm",
            "train",
            "host-a",
            0,
        )
        assert listed["storm"]["gpus"] == 16 and listed["storm"]["hosts"] == 2
        incident = manager.get(listed["id"])
        assert incident is not None and [v["reason"] for v in incident.verdicts] == ["xid_storm"]
        assert incident.storm is not None
        storm = msgspec.to_builtins(incident.storm)
        assert (storm["origin_host"], storm["origin_gpu"], storm["origin_xid"]) == ("host-a", 0, 45)
        assert (storm["gpus"], storm["hosts"], storm["reports"], storm["sympathetic"]) == (16, 2, 16, 15)

    asyncio.run(run())


def test_a_storm_around_a_real_fault_joins_the_faults_incident(tmp_path: Path) -> None:
    engine, views = engine_with_job(["host-a"])

    async def run() -> None:
        manager = incidents(engine, tmp_path)
        send(engine, views, "host-a", 2, T0 + 1, [xid(2, 95, T0 + 1, "Uncontained memory error")])
        send(engine, views, "host-a", 3, T0 + 2, [xid(g, 95, T0 + 1.5) for g in range(8) if g != 2])
        engine.tick(T0 + 3)
        await asyncio.gather(*manager.tasks)
        (listed,) = manager.list()
        assert (listed["reason"], listed["host"], listed["gpu"]) == ("xid_95", "host-a", 2)
        (storm,) = [v for v in engine.verdicts("open") if v.reason == "xid_storm"]
        assert storm.incident == listed["id"]

    asyncio.run(run())

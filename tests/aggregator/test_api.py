"""REST API, metrics and incidents — including real agents on simulated hosts over 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent.agent import Agent
from sentinel.aggregator.incidents import IncidentStore, merge_timeline
from sentinel.components.xid.parse import xid_record
from sentinel.config.agent import (
    AgentConfig,
    AgentIdentity,
    CollectConfig,
    KmsgConfig,
    ProbeConfig,
    RingConfig,
    StreamConfig,
    SystemdConfig,
)
from sentinel.config.aggregator import AggregatorConfig, FleetConfig, IncidentsConfig
from sentinel.config.common import MetricsConfig
from sentinel.fr.heads import FrHeads
from sentinel.sim.host import sim_hosts
from sentinel.sim.scenario import load_scenario_text
from sentinel.wire import (
    Answer,
    CommandResult,
    EventEntry,
    FrDumpAnswer,
    GpuSample,
    GpuWasReset,
    HeadsEntry,
    LogLine,
    ProcInfo,
    RingEntry,
    SampleEntry,
    Snapshot,
    SnapshotRequest,
    XidOccurred,
    encode,
)
from tests.aggregator.helpers import TOKEN, agent, batch, running_aggregator, wait_until

CATALOG = {
    "sentinel_verdict_open",
    "sentinel_verdicts_opened",
    "sentinel_job_stalled",
    "sentinel_jobs_stalled",
    "sentinel_job_ranks",
    "sentinel_gpus",
    "sentinel_agents_connected",
    "sentinel_host_last_seen_timestamp_seconds",
    "sentinel_ingest_batches",
    "sentinel_ingest_samples",
    "sentinel_ingest_events",
    "sentinel_ingest_rejected",
    "sentinel_ingest_lag_seconds",
    "sentinel_detection_latency_seconds",
    "sentinel_incidents",
}


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_api_endpoints_and_metrics_catalog(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "h1") as a:
        t = time.time()
        procs = [ProcInfo(gpu=g, pid=10 + g, job_id="job-1", rank=g, world_size=8) for g in range(8)]
        first = batch(0, t)
        first.procs = procs
        await a.send(first)
        await a.ack()
        second = batch(
            1,
            t + 0.1,
            events=[XidOccurred(t=t, gpu=2, text="NVRM: Xid 48", record=xid_record(48, "NVRM: Xid 48"))],
        )
        await a.send(second)
        await a.ack()

        health = await get_json(running.url + "/healthz")
        assert health["status"] == "ok" and health["agents"] == 1
        verdicts = (await get_json(running.url + "/api/v1/verdicts?state=open"))["verdicts"]
        assert [(v["kind"], v["host"], v["gpu"], v["job"], v["rank"], v["reason"]) for v in verdicts] == [
            ("faulty", "h1", 2, "job-1", 2, "xid_48")
        ]
        assert {"id", "opened_at", "closed_at", "state", "evidence", "action", "t_s"} <= set(verdicts[0])
        assert (await get_json(running.url + "/api/v1/verdicts?state=closed"))["verdicts"] == []
        jobs = (await get_json(running.url + "/api/v1/jobs"))["jobs"]
        assert [(j["id"], j["ranks"], j["stalled"]) for j in jobs] == [("job-1", 8, False)]
        job = await get_json(running.url + "/api/v1/jobs/job-1")
        assert [r["rank"] for r in job["rank_list"]] == list(range(8)) and job["verdicts"]
        hosts = (await get_json(running.url + "/api/v1/hosts"))["hosts"]
        assert hosts[0]["name"] == "h1" and hosts[0]["gpus"][2]["health"] == "faulty"
        async with aiohttp.ClientSession() as session:
            for path in ("/api/v1/jobs/nope", "/api/v1/incidents/nope", "/api/v1/incidents/..%2f..%2fetc"):
                async with session.get(running.url + path) as response:
                    assert response.status == 404
            async with session.get(running.url + "/api/v1/verdicts?state=maybe") as response:
                assert response.status == 400
            async with session.get(running.url + "/") as response:
                assert response.status == 404  # left free for the status page
            async with session.get(running.url + "/metrics") as response:
                text = await response.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(families) >= CATALOG
        assert all(name.startswith("sentinel_") for name in families)
        open_series = families["sentinel_verdict_open"].samples
        assert [
            (s.labels["kind"], s.labels["host"], s.labels["gpu"], s.labels["rank"]) for s in open_series
        ] == [("faulty", "h1", "2", "2")]
        assert all(s.labels.get("cluster") == "default" for f in families.values() for s in f.samples)


async def test_two_aggregators_in_one_process_have_their_own_metrics(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path / "a") as one, running_aggregator(tmp_path / "b") as two:
        async with agent(one, "h1") as a:
            await a.send(batch(0, time.time()))
            await a.ack()
        value = one.aggregator.metrics.registry.get_sample_value(
            "sentinel_ingest_batches_total", {"cluster": "default"}
        )
        other = two.aggregator.metrics.registry.get_sample_value(
            "sentinel_ingest_batches_total", {"cluster": "default"}
        )
        assert (value, other) == (1.0, 0.0)


def test_merge_timeline_orders_hosts_and_names_answers_that_are_not_snapshots() -> None:
    reset = GpuWasReset(t=2.0, gpu=1)
    snapshots: dict[str, Answer | None] = {
        "b": Snapshot(host="b", window=(0.0, 9.0), entries=[EventEntry(t=2.0, data=reset)]),
        "a": Snapshot(
            host="a",
            window=(0.0, 9.0),
            entries=[
                SampleEntry(t=1.0, data=GpuSample(gpu=0, t=1.0)),
                HeadsEntry(t=3.0, data=FrHeads(rank=0, t=3.0)),
            ],
        ),
        "c": FrDumpAnswer(),  # answered with something else
        "d": Snapshot(host="d", window=(0.0, 100.0), entries=[EventEntry(t=100.0, data=reset)]),  # outside
        "e": None,
    }
    timeline, problems = merge_timeline(snapshots, 0.0, 10.0, 100)
    assert [(e.t, e.host, e.type) for e in timeline] == [
        (1.0, "a", "sample"),
        (2.0, "b", "event"),
        (3.0, "a", "heads"),
    ]
    assert timeline[1].data == {"kind": "gpu_reset", "t": 2.0, "gpu": 1}
    assert problems == [
        "c: answered the snapshot with FrDumpAnswer, not a snapshot",
        "e: answered the snapshot with NoneType, not a snapshot",
    ]


async def test_incident_collects_every_agents_snapshot_into_one_timeline(tmp_path: Path) -> None:
    config = AggregatorConfig(incidents=IncidentsConfig(snapshot_timeout_s=5.0))
    async with (
        running_aggregator(tmp_path, config) as running,
        agent(running, "h1") as a1,
        agent(running, "h2") as a2,
    ):
        t = time.time()
        for conn, host in ((a1, "h1"), (a2, "h2")):
            first = batch(0, t)
            first.procs = [
                ProcInfo(gpu=g, pid=g, job_id="job", rank=(host == "h2") * 8 + g) for g in range(8)
            ]
            await conn.send(first)
            await conn.ack()
        await a2.send(
            batch(
                1,
                t,
                events=[XidOccurred(t=t, gpu=5, text="NVRM: Xid 79", record=xid_record(79, "NVRM: Xid 79"))],
            )
        )
        await a2.ack()

        async def answer(conn: Any, host: str, t0: float) -> None:
            # the incident's snapshot request, whenever it comes: the host's verdict pushback (a
            # VerdictsRequest after a tick) may come before or after it
            def snapshot_requests() -> list[Any]:
                return [c for c in conn.commands if isinstance(c.request, SnapshotRequest)]

            while not snapshot_requests():
                msg = await conn.ws.receive(timeout=5)
                from sentinel.wire import decode_aggregator_frame

                conn.commands.append(decode_aggregator_frame(msg.data))
            [command] = snapshot_requests()
            assert command.request.since is not None and command.request.since <= t0
            entries: list[RingEntry] = [
                EventEntry(t=t0 - 3 + i, data=LogLine(t=t0 - 3 + i, text=f"{host} line {i}"))
                for i in range(3)
            ]
            snapshot = Snapshot(host=host, window=(t0 - 60, t0), entries=entries)
            await conn.ws.send_bytes(encode(CommandResult(id=command.id, answer=snapshot)))

        await asyncio.gather(answer(a1, "h1", t - 0.5), answer(a2, "h2", t))
        aggregator = running.aggregator
        await wait_until(lambda: bool(aggregator.incidents.list()))
        listed = (await get_json(running.url + "/api/v1/incidents"))["incidents"]
        assert len(listed) == 1 and listed[0]["hosts"] == ["h2", "h1"] and listed[0]["missing_hosts"] == []
        incident = await get_json(running.url + f"/api/v1/incidents/{listed[0]['id']}")
        timeline = incident["timeline"]
        assert [e["t"] for e in timeline] == sorted(e["t"] for e in timeline)
        assert {e["host"] for e in timeline if e["type"] == "event"} == {"h1", "h2"}
        assert next(e for e in timeline if e["type"] == "verdict")["data"]["reason"] == "xid_79"

        # the command line, through the API and straight from the state directory
        for source in (["--api", running.url], ["--state-dir", str(tmp_path)]):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sentinel", "incident", *source, "show", listed[0]["id"],
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            text = out.decode()
            assert proc.returncode == 0, err.decode()
            assert "xid_79" in text and "h1 line 0" in text and "h2 line 2" in text
            assert text.index("h1 line 0") < text.index("h2 line 0")  # time order across hosts
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sentinel", "incident", "--state-dir", str(tmp_path / "nowhere"), "list",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 2 and err.decode().count("\n") == 1
    assert IncidentStore(tmp_path).get(listed[0]["id"]) is not None  # persisted


def agent_config(host: str, url: str, token_file: Path, state_dir: Path) -> AgentConfig:
    return AgentConfig(
        agent=AgentIdentity(host=host, cluster="default", state_dir=str(state_dir)),
        collect=CollectConfig(tick_s=0.5, slow_tick_s=1.0, nvml_timeout_s=1.0, procs_interval_s=1.0),
        kmsg=KmsgConfig(enabled=False),
        probe=ProbeConfig(socket_path=""),
        stream=StreamConfig(
            aggregator_url=url, token_file=str(token_file), backoff_initial_s=0.2, backoff_max_s=1.0
        ),
        ring=RingConfig(window_s=120.0, max_bytes=4 * 1024 * 1024),
        metrics=MetricsConfig(listen_host=""),
        systemd=SystemdConfig(notify=False),
    )


async def test_real_agents_on_simulated_hosts_end_to_end(tmp_path: Path) -> None:
    """Real agents stream simulated hosts to a real aggregator; Xid 79 → faulty + an incident from both."""
    scenario = load_scenario_text(
        """
        seed = 1
        duration_s = 60
        tick_s = 0.5
        [cluster]
        hosts = 2
        gpus_per_host = 4
        [[jobs]]
        id = "e2e"
        [[faults]]
        at_s = 3.0
        host = "host-001"
        gpu = 1
        kind = "xid"
        xid = 79
        [[faults]]
        at_s = 3.0
        host = "host-000"
        gpu = 2
        kind = "hang"
        """
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = AggregatorConfig(
        fleet=FleetConfig(tick_s=0.5), incidents=IncidentsConfig(snapshot_timeout_s=5.0)
    )
    async with running_aggregator(tmp_path / "agg", config) as running:
        started = time.time()
        cluster, hosts = sim_hosts(scenario, started_at=started, clock=time.time)
        agents = [
            Agent(
                agent_config(h.name, running.stream_url, token_file, tmp_path / h.name),
                h,
                h.inputs(),
                time.time,
            )
            for h in hosts
        ]
        tasks = [asyncio.create_task(a.run()) for a in agents]
        try:
            aggregator = running.aggregator

            def kinds() -> set[tuple[str, str | None, int | None]]:
                return {(v.kind, v.host, v.gpu) for v in aggregator.engine.book.all()}

            await wait_until(lambda: len(aggregator.by_host) == 2, 15)
            await wait_until(
                lambda: any(v.kind == "faulty" for v in aggregator.engine.book.open.values()), 20
            )
            faulty = next(v for v in aggregator.engine.book.open.values() if v.kind == "faulty")
            assert (faulty.host, faulty.gpu, faulty.reason) == ("host-001", 1, "xid_79")
            assert faulty.opened_at - (started + 3.0) <= 3.0 + 1.0  # hardware bound plus one agent tick
            job = aggregator.engine.fleet.jobs["e2e"]
            assert {r.host for r in job.ranks.values()} == {"host-000", "host-001"}
            await wait_until(lambda: ("stuck", "host-000", 2) in kinds(), 20)
            hung = next(
                v for v in aggregator.engine.book.all() if (v.kind, v.host, v.gpu) == ("stuck", "host-000", 2)
            )
            assert hung.rank == 2 and hung.reason == "not_entered_collective"
            assert hung.opened_at - (started + 3.0) <= 10.0 + 1.0  # hang bound plus one agent tick
            # nothing names a GPU without a fault: waiting peers are never blamed
            assert {(v.host, v.gpu) for v in aggregator.engine.book.all()} <= {
                ("host-001", 1),
                ("host-000", 2),
            }
            await wait_until(lambda: bool(aggregator.incidents.list()), 20)
            incident = aggregator.incidents.get(aggregator.incidents.list()[-1]["id"])  # the first one
            assert incident is not None and sorted(incident.hosts) == ["host-000", "host-001"]
            assert incident.missing_hosts == []
            timeline = incident.timeline
            # GPU samples from the faulty host only; the job's other hosts contribute their heads and events
            assert {e.host for e in timeline if e.type == "sample"} == {"host-001"}
            assert {e.host for e in timeline if e.type != "verdict"} == {"host-000", "host-001"}
        finally:
            for a in agents:
                a.request_stop()
            await asyncio.wait(tasks, timeout=10)
            for task in tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            cluster.close()

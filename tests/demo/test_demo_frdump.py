"""What a demo incident says about flight-recorder dumps: simulated hosts run no PyTorch ranks.

The demo's agents are real agents on simulated hosts (``sentinel.demo.hooks``); the aggregator's incident
manager asks each for the job's dumps through the real command dispatcher. There is no PyTorch process to
dump, and the incident must say exactly that rather than a generic "no agent returned a dump".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import msgspec

from sentinel.agent.agent import Agent
from sentinel.agent.fr_control import SIMULATED_NO_DUMP
from sentinel.agent.source import GpuSource
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.frdumps import FrDumpSettings
from sentinel.aggregator.incidents import IncidentManager, IncidentStore
from sentinel.aggregator.state import JobView, RankView
from sentinel.aggregator.verdicts import Verdict
from sentinel.config.aggregator import AggregatorConfig, IncidentsConfig
from sentinel.demo import scenarios
from sentinel.demo.hooks import agent_config
from sentinel.sim.host import SimCluster
from sentinel.wire import Command, CommandResult


async def test_a_demo_incident_says_why_it_has_no_flight_recorder_dump(tmp_path: Path) -> None:
    now = time.time()
    sim = SimCluster(scenarios.load(None), started_at=now, clock=time.time)
    try:
        hosts = sim.hosts[:2]
        agents = {}
        for host in hosts:
            config = agent_config(
                host.name,
                tick_s=1.0,
                stream_url="ws://127.0.0.1:1/",
                token_file=tmp_path / "token",
                state_dir=tmp_path / host.name,
            )
            agents[host.name] = Agent(config, cast(GpuSource, host), host.inputs(), time.time)
        engine = Engine(AggregatorConfig())
        job = engine.fleet.jobs["job-1"] = JobView(id="job-1", world_size=2)
        for rank, host in enumerate(hosts):
            job.ranks[rank] = RankView(rank=rank, host=host.name, gpu=0)

        async def requester(host: str, command: Command, timeout: float) -> CommandResult | None:
            # the wire round trip: the command as the agent decodes it, its answer as the aggregator reads it
            wired = msgspec.msgpack.decode(msgspec.msgpack.encode(command), type=Command)
            return await agents[host].handle_command(wired)

        manager = IncidentManager(
            engine,
            IncidentStore(tmp_path / "incidents"),
            requester,
            IncidentsConfig(snapshot_timeout_s=2.0),
            fr_dumps=FrDumpSettings(wait_s=0.5, answer_margin_s=1.0, workers=1),
        )
        verdict = Verdict(
            id="v-1",
            key=("stuck", "job-1", "1"),
            detector="stuck",
            kind="stuck",
            reason="not_entered_collective",
            action="restart_app",
            host=hosts[1].name,
            gpu=0,
            job="job-1",
            rank=1,
            evidence=["rank 1 never entered"],
            opened_at=now,
            evidence_t=now,
            updated_at=now,
        )
        await manager.collect("inc-1", verdict, now)
        found = manager.get("inc-1")
        assert found is not None and found.fr_dump is not None
        fr = msgspec.to_builtins(found.fr_dump)
    finally:
        sim.close()
    assert fr["state"] == "no_dumps" and fr["missing_hosts"] == []
    names = ", ".join(sorted(h.name for h in hosts))
    assert fr["error"] == f"no agent returned a flight-recorder dump: {SIMULATED_NO_DUMP} ({names})"

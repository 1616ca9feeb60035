"""End to end over real sockets: a torch.distributed gloo job of 8 CPU ranks with the probe, two real agents
(4 fake GPU slots each) and a real aggregator on 127.0.0.1.

Ranks 0-3 run on node-a, 4-7 on node-b (LOCAL_RANK 0-3; without NVML pids the agent takes the GPU slot
from LOCAL_RANK). First a healthy run of the job: every rank reports, the job progresses, no verdict of any
kind opens. Then the same job again, where rank 5 stops before a gradient all_reduce its peers enter: the
aggregator's stuck verdict names rank 5 on node-b GPU 1 within 10 s of it stopping and never blames a
waiting peer; the incident it opens carries the job-wide flight-recorder dump (every rank's dump through
the agents' fr_dump) and its analysis naming rank 5 and the all_reduce.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sentinel.config.aggregator import AggregatorConfig, FleetConfig, IncidentsConfig
from tests.aggregator.helpers import running_aggregator
from tests.integration.harness import (
    GPUS_PER_HOST,
    HOSTS,
    START_WITHIN_S,
    WORLD,
    Cluster,
    Job,
    agents,
    all_ranks_report,
    get_json,
    hang_until_stuck,
    host_of,
    until,
)
from tests.integration.harness import verdicts as harness_verdicts
from tests.support import REPO, need_module

CULPRIT = 5  # node-b, LOCAL_RANK 1
HEALTHY_OBSERVE_S = 10.0  # as long as the hang run needs to name the culprit
DETECT_WITHIN_S = 10.0

pytestmark = pytest.mark.timeout(2 * START_WITHIN_S + 120)


async def test_gloo_job_hang_is_named_with_host_and_gpu_and_fr_dump_analyzed(tmp_path: Path) -> None:
    need_module("torch")
    sockets = Path(tempfile.mkdtemp(prefix="snt-"))
    cluster = Cluster(tmp_path, sockets)
    config = AggregatorConfig(
        fleet=FleetConfig(tick_s=0.5), incidents=IncidentsConfig(snapshot_timeout_s=5.0)
    )
    jobs: list[Job] = []
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        async with (
            running_aggregator(tmp_path / "aggregator", config) as running,
            agents(cluster, running),
            aiohttp.ClientSession() as session,
        ):
            url = running.url

            async def verdicts() -> list[dict[str, Any]]:
                return await harness_verdicts(session, url)

            # 1. healthy run: every rank reports, the job progresses, no verdict opens
            healthy = Job(cluster, "train-healthy")
            jobs.append(healthy)
            await until(
                "healthy ranks report",
                lambda: all_ranks_report(session, url, healthy),
                START_WITHIN_S,
                healthy,
            )
            timings["healthy_reporting_s"] = time.monotonic() - started
            first = await get_json(session, f"{url}/api/v1/jobs/{healthy.id}")
            observe_end = time.monotonic() + HEALTHY_OBSERVE_S
            while time.monotonic() < observe_end:
                assert await verdicts() == [], "a healthy run opened a verdict"
                assert healthy.proc.poll() is None, healthy.output()
                await asyncio.sleep(0.5)
            later = await get_json(session, f"{url}/api/v1/jobs/{healthy.id}")
            assert later["last_progress_at"] > first["last_progress_at"], "the healthy job made no progress"
            (healthy.control / "stop").write_text("1")
            assert await asyncio.to_thread(healthy.proc.wait, 30) == 0, healthy.output()
            assert sorted(p.name for p in healthy.control.glob("done_*")) == [
                f"done_{r}" for r in range(WORLD)
            ]
            assert await verdicts() == [], "the healthy run's clean end opened a verdict"
            timings["healthy_done_s"] = time.monotonic() - started

            # 2. the same job; rank 5 stops before a gradient all_reduce its peers enter
            hang = Job(cluster, "train-hang")
            jobs.append(hang)
            await until(
                "hang-run ranks report", lambda: all_ranks_report(session, url, hang), START_WITHIN_S, hang
            )
            await asyncio.sleep(2.0)  # a few healthy steps first
            early = await verdicts()
            assert early == [], json.dumps(early, indent=1)
            verdict, stopped_at = await hang_until_stuck(session, url, hang, CULPRIT, DETECT_WITHIN_S)
            timings["detect_s"] = verdict["opened_at"] - stopped_at
            assert verdict["job"] == hang.id
            where = (CULPRIT, host_of(CULPRIT), CULPRIT % GPUS_PER_HOST)
            assert (verdict["rank"], verdict["host"], verdict["gpu"]) == where, verdict
            assert verdict["reason"] == "not_entered_collective", verdict
            assert verdict["opened_at"] - stopped_at <= DETECT_WITHIN_S, timings

            # 3. the incident gets every rank's flight-recorder dump and its analysis
            incident_id = verdict["incident"]
            assert incident_id

            async def fr_done() -> dict[str, Any] | None:
                async with session.get(f"{url}/api/v1/incidents/{incident_id}") as response:
                    if response.status != 200:
                        return None
                    incident = await response.json()
                fr = incident.get("fr_dump") or {}
                return incident if fr.get("state") not in (None, "collecting") else None

            incident = await until("incident FR analysis", fr_done, 30, hang)
            timings["fr_analysis_s"] = time.monotonic() - started
            fr = incident["fr_dump"]
            assert fr["state"] == "done", fr
            assert fr["ranks"] == list(range(WORLD)), fr
            assert sorted(fr["hosts"]) == list(HOSTS)
            analysis = fr["analysis"]
            assert analysis["verdict"] == "hang", analysis
            assert analysis["culprit_ranks"] == [CULPRIT], analysis
            assert analysis["collective"]["op"].endswith("all_reduce"), analysis
            assert analysis["collective"]["pg_desc"] == "default_pg", analysis

            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sentinel", "incident", "--api", url, "show", incident_id,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            assert f"analysis: hang, culprit rank(s) {CULPRIT}" in out.decode(), out.decode()[:3000]

            # never a waiting peer, on either run
            for v in await verdicts():
                assert v["job"] == hang.id and v["rank"] == CULPRIT, v
    finally:
        for job in jobs:
            job.kill()
        shutil.rmtree(sockets, ignore_errors=True)
        timings["total_s"] = time.monotonic() - started
        print("timings:", json.dumps({k: round(v, 2) for k, v in timings.items()}))

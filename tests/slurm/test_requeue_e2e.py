"""End to end on a real Slurm: a hung batch job is requeued without its culprit's node and runs again elsewhere.

On 127.0.0.1: munged, slurmctld and three slurmd (gn1, gn2, gn3), a real agent per node and a real aggregator
with remediation acting (``stuck`` verdicts drain, requeue enabled). An ``sbatch`` job on two nodes runs a
torch gloo job through ``srun`` (two ranks per node, each with the probe).

A rank on gn2 hangs → the stuck verdict names it → the aggregator drains gn2 and requeues the job with gn2 in
its excluded nodes → Slurm starts the job again on gn1 and gn3 → its ranks report moving heads again, and the
incident's phases say when each step happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sentinel.config.aggregator import (
    AggregatorConfig,
    BreakerConfig,
    FleetConfig,
    IncidentsConfig,
    RemediationConfig,
    RemediationRule,
    RequeueConfig,
)
from tests.aggregator.helpers import TOKEN, running_aggregator
from tests.slurm.cluster import SlurmCluster, available, free_port
from tests.slurm.test_slurm_e2e import RANKS_PER_NODE, _gloo_agents, _until
from tests.support import REPO, need, need_module

pytestmark = pytest.mark.timeout(200)

NODES = ("gn1", "gn2", "gn3")
CULPRIT = 3  # the second node of the first allocation (gn2), local rank 1


def _aggregator_config() -> AggregatorConfig:
    return AggregatorConfig(
        fleet=FleetConfig(tick_s=0.5),
        incidents=IncidentsConfig(enabled=True, snapshot_timeout_s=3.0),
        remediation=RemediationConfig(
            enabled=True,
            dry_run=False,
            rules=[RemediationRule(kind="stuck"), RemediationRule(do="none")],
            breaker=BreakerConfig(
                window_s=3600, max_drains=2, max_fraction=1.0, max_unavailable_fraction=0.9
            ),
            requeue=RequeueConfig(enabled=True, max_requeues=1),
            retry_s=2.0,
            command_timeout_s=10.0,
        ),
    )


def _job_fields(slurm: SlurmCluster, job: str) -> dict[str, str]:
    text = slurm.run("scontrol", "show", "job", "-o", job, check=False)
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


async def test_hung_job_is_requeued_without_its_node_and_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(available(), "slurm-wlm and munge not installed")
    need_module("torch")
    root = Path(tempfile.mkdtemp(prefix="srq-", dir="/tmp"))  # short: unix socket paths
    sockets = root / "sock"
    sockets.mkdir()
    control = root / "job"
    control.mkdir()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    slurm = SlurmCluster(root / "slurm", NODES, cred_expire_s=10)
    (root / "slurm").mkdir()
    job = ""
    try:
        async with running_aggregator(tmp_path / "aggregator", _aggregator_config()) as running:
            url = running.url
            await asyncio.to_thread(slurm.start)
            monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # the aggregator's scontrol/sinfo
            spec = control / "spec.json"
            spec.write_text(
                json.dumps(
                    {
                        "port": free_port(),
                        "control": str(control),
                        "sockets": str(sockets),
                        "step_s": 0.05,
                        "probe_interval_s": 1.0,
                        "world_size": 2 * RANKS_PER_NODE,
                        "ranks_per_node": RANKS_PER_NODE,
                    }
                )
            )
            script = root / "train.sh"
            script.write_text(
                f"#!/bin/sh\nexec srun --kill-on-bad-exit=1 {sys.executable} -m tests.slurm.srun_gloo {spec}\n"
            )
            async with (
                _gloo_agents(tmp_path, running, token, sockets, NODES),
                aiohttp.ClientSession() as session,
            ):

                async def get(path: str) -> Any:
                    async with session.get(f"{url}{path}") as response:
                        return await response.json() if response.status == 200 else {}

                job = slurm.run(
                    "sbatch", "--parsable", "--requeue", "-N2", "--ntasks-per-node=1",
                    f"--chdir={REPO}", "-o", str(tmp_path / "job-%j.log"), str(script),
                ).strip().split(";")[0]  # fmt: skip

                def job_output() -> str:
                    return "".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("job-*.log"))

                async def progressing(after: float) -> bool:
                    found = await get(f"/api/v1/jobs/{job}")
                    ranks = found.get("rank_list") or []
                    return len(ranks) >= 2 * RANKS_PER_NODE and (found.get("last_progress_at") or 0) > after

                await _until("the job's ranks report", lambda: progressing(0), 60, every=0.5, why=job_output)
                # the builtin scheduler takes the first free nodes; ranks 2 and 3 are on the second one
                assert _job_fields(slurm, job)["NodeList"] == "gn[1-2]"
                (control / "hang").write_text(str(CULPRIT))

                async def stuck() -> dict[str, Any] | None:
                    verdicts = (await get("/api/v1/verdicts"))["verdicts"]
                    return next((v for v in verdicts if v["kind"] == "stuck" and v["host"] == "gn2"), None)

                verdict = await _until("stuck verdict on gn2", stuck, 30, why=job_output)
                assert verdict["job"] == job and verdict["rank"] == CULPRIT, verdict

                async def requeued() -> dict[str, str] | None:
                    fields = await asyncio.to_thread(_job_fields, slurm, job)
                    return fields if "gn2" in fields.get("ExcNodeList", "").split(",") else None

                fields = await _until("the job requeued without gn2", requeued, 20)
                assert fields["Restarts"] == "1", fields
                assert "DRAIN" in slurm.node_state("gn2")[0]
                # the next run must not hang again, and its rendezvous gets a port of its own
                (control / "hang").unlink()
                spec.write_text(json.dumps(json.loads(spec.read_text()) | {"port": free_port()}))
                requeued_at = time.time()

                async def running_elsewhere() -> dict[str, str] | None:
                    fields = await asyncio.to_thread(_job_fields, slurm, job)
                    return fields if fields.get("JobState") == "RUNNING" else None

                fields = await _until(
                    "the job running again", running_elsewhere, 60, every=0.5, why=job_output
                )
                assert fields["NodeList"] in ("gn[1,3]", "gn1,gn3"), fields
                await _until(
                    "the requeued job's ranks make progress", lambda: progressing(requeued_at), 60,
                    every=0.5, why=job_output,
                )  # fmt: skip

                records = {
                    r["action"]: r
                    for v in (await get("/api/v1/verdicts"))["verdicts"]
                    if v["id"] == verdict["id"]
                    for r in v.get("remediation") or []
                }
                assert records["drain"]["outcome"] == "done" and records["requeue"]["outcome"] == "done", (
                    records
                )
                assert f"job {job} requeued with ExcNodeList=gn2" == records["requeue"]["detail"]

                # the incident's phases, in order, and the GPU time the job lost until it moved again
                async def resumed() -> dict[str, Any] | None:
                    found = await get(f"/api/v1/incidents/{verdict['incident']}")
                    return found if (found.get("phases") or {}).get("resumed_at") else None

                incident = await _until("the incident's resumption", resumed, 20)
                p = incident["phases"]
                assert p["named_at"] == verdict["opened_at"], p
                assert p["fault_at"] <= p["detected_at"] <= p["named_at"] <= p["drained_at"], p
                assert p["drained_at"] <= p["requeued_at"] <= requeued_at < p["resumed_at"], p
                assert (
                    p["drained_at"] == records["drain"]["t"] and p["requeued_at"] == records["requeue"]["t"]
                )
                expected = 2 * RANKS_PER_NODE * (p["resumed_at"] - p["fault_at"])
                assert incident["gpu_seconds_lost"] == pytest.approx(expected, abs=0.01), incident
    finally:
        with contextlib.suppress(Exception):
            slurm.run("scancel", "--full", "-u", "root", timeout=5, check=False)
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)
    left = slurm.leftovers()
    assert not left, [(p.pid, p.name()) for p in left]

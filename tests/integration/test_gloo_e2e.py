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
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil
import pytest

from sentinel.agent import Agent
from sentinel.config.agent import AgentConfig
from sentinel.config.aggregator import AggregatorConfig, FleetConfig, IncidentsConfig
from tests.agent.fakes import FakeSource
from tests.aggregator.helpers import TOKEN, Running, running_aggregator
from tests.support import REPO, need_module

HOSTS = ("node-a", "node-b")
GPUS_PER_HOST = 4
WORLD = len(HOSTS) * GPUS_PER_HOST
CULPRIT = 5  # node-b, LOCAL_RANK 1
HEALTHY_OBSERVE_S = 10.0  # as long as the hang run needs to name the culprit
DETECT_WITHIN_S = 10.0
#: until every rank of a run reports: 8 processes importing torch take ~10 s quiet and well over a minute on a
#: loaded 2-core machine (the import alone took 28-60 s each at load 5); the wait ends as soon as they report
START_WITHIN_S = 150.0

pytestmark = pytest.mark.timeout(2 * START_WITHIN_S + 120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """Paths of the two simulated hosts: probe sockets (short paths: unix socket names are <108 bytes),
    dump-pipe prefixes and dump folders."""

    def __init__(self, tmp: Path, sockets: Path) -> None:
        self.tmp = tmp
        self.sockets = sockets
        for host in HOSTS:
            (tmp / host / "pipes").mkdir(parents=True)
            (tmp / host / "dumps").mkdir(parents=True)

    def socket(self, host: str) -> str:
        return str(self.sockets / f"{host}.sock")

    def pipe_prefix(self, host: str) -> str:
        return str(self.tmp / host / "pipes" / "nccl_pipe_")

    def dump_dir(self, host: str) -> Path:
        return self.tmp / host / "dumps"

    def agent_config(self, host: str, url: str, token_file: Path) -> AgentConfig:
        data = {
            "agent": {"host": host, "state_dir": str(self.tmp / host / "state")},
            "collect": {"tick_s": 0.5, "slow_tick_s": 2.0, "nvml_timeout_s": 1.0, "procs_interval_s": 2.0},
            "kmsg": {"enabled": False},
            "probe": {
                "socket_path": self.socket(host),
                "fr_dump_dir": str(self.dump_dir(host)),
                "fr_dump_prefix": "nccl_trace_rank_",
                "fr_pipe_prefix": self.pipe_prefix(host),
            },
            "metrics": {"listen_host": ""},
            "stream": {
                "aggregator_url": url,
                "token_file": str(token_file),
                "backoff_initial_s": 0.2,
                "backoff_max_s": 1.0,
            },
            "systemd": {"notify": False},
        }
        return msgspec.convert(data, AgentConfig)

    def job_spec(self, job_id: str, control: Path) -> dict[str, Any]:
        ranks = []
        for rank in range(WORLD):
            host = HOSTS[rank // GPUS_PER_HOST]
            env = {
                "SENTINEL_PROBE_SOCKET": self.socket(host),
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": self.pipe_prefix(host),
                "TORCH_FR_DUMP_TEMP_FILE": str(self.dump_dir(host) / "nccl_trace_rank_"),
            }
            ranks.append({"rank": rank, "local_rank": rank % GPUS_PER_HOST, "env": env})
        return {
            "job_id": job_id,
            "port": _free_port(),
            "control": str(control),
            "step_s": 0.05,
            "probe_interval_s": 1.0,
            "ranks": ranks,
        }


class Job:
    """One launch of tests/integration/gloo_train.py (its own process group, killed as a whole)."""

    def __init__(self, cluster: Cluster, job_id: str) -> None:
        self.id = job_id
        self.control = cluster.tmp / job_id
        self.control.mkdir()
        spec = self.control / "spec.json"
        spec.write_text(json.dumps(cluster.job_spec(job_id, self.control)))
        self.log = (self.control / "output.log").open("wb")
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.gloo_train", str(spec)],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.flush()
        return (self.control / "output.log").read_text(errors="replace")[-3000:]

    def rank_pids(self) -> list[int]:
        path = self.control / "pids"
        return json.loads(path.read_text()) if path.exists() else []

    def kill(self) -> None:
        """SIGKILL the launcher's process group, wait (bounded) until no rank is left."""
        pids = self.rank_pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        self.log.close()
        left = [p for p in pids if _alive(p)]
        assert not left, f"ranks still running: {left}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        assert response.status == 200, f"{url}: HTTP {response.status}"
        return await response.json()


async def _until(what: str, check: Any, timeout: float, job: Job | None = None) -> Any:
    """Poll the async ``check`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if job is not None and job.proc.poll() is not None:
            raise AssertionError(f"{what}: job exited with {job.proc.returncode}:\n{job.output()}")
        if time.monotonic() > deadline:
            detail = f"\n{job.output()}" if job is not None else ""
            raise AssertionError(f"{what}: not within {timeout} s{detail}")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def _agents(cluster: Cluster, running: Running) -> AsyncIterator[list[Agent]]:
    token = cluster.tmp / "token"
    token.write_text(TOKEN)
    agents = [
        Agent(cluster.agent_config(host, running.stream_url, token), FakeSource(gpus=GPUS_PER_HOST))
        for host in HOSTS
    ]
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        yield agents
    finally:
        for a in agents:
            a.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


async def _all_ranks_report(session: aiohttp.ClientSession, url: str, job: Job) -> bool:
    async with session.get(f"{url}/api/v1/jobs/{job.id}") as response:
        if response.status != 200:
            return False
        detail = await response.json()
    ranks = detail.get("rank_list") or []
    return len(ranks) == WORLD and all(r.get("host") and r.get("gpu") is not None for r in ranks)


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
            _agents(cluster, running),
            aiohttp.ClientSession() as session,
        ):
            url = running.url

            async def verdicts() -> list[dict[str, Any]]:
                return list((await _get(session, f"{url}/api/v1/verdicts"))["verdicts"])

            # 1. healthy run: every rank reports, the job progresses, no verdict opens
            healthy = Job(cluster, "train-healthy")
            jobs.append(healthy)
            await _until(
                "healthy ranks report",
                lambda: _all_ranks_report(session, url, healthy),
                START_WITHIN_S,
                healthy,
            )
            timings["healthy_reporting_s"] = time.monotonic() - started
            first = await _get(session, f"{url}/api/v1/jobs/{healthy.id}")
            observe_end = time.monotonic() + HEALTHY_OBSERVE_S
            while time.monotonic() < observe_end:
                assert await verdicts() == [], "a healthy run opened a verdict"
                assert healthy.proc.poll() is None, healthy.output()
                await asyncio.sleep(0.5)
            later = await _get(session, f"{url}/api/v1/jobs/{healthy.id}")
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
            await _until(
                "hang-run ranks report", lambda: _all_ranks_report(session, url, hang), START_WITHIN_S, hang
            )
            await asyncio.sleep(2.0)  # a few healthy steps first
            early = await verdicts()
            assert early == [], json.dumps(early, indent=1)
            (hang.control / "hang").write_text(str(CULPRIT))
            hung_file = hang.control / f"hung_{CULPRIT}"

            async def culprit_stopped() -> bool:
                return hung_file.exists() and bool(hung_file.read_text())

            await _until("culprit stops", culprit_stopped, 10, hang)
            stopped_at = float(hung_file.read_text())

            async def stuck_verdict() -> dict[str, Any] | None:
                return next((v for v in await verdicts() if v["kind"] == "stuck"), None)

            verdict = await _until("stuck verdict", stuck_verdict, DETECT_WITHIN_S + 5, hang)
            timings["detect_s"] = verdict["opened_at"] - stopped_at
            assert verdict["job"] == hang.id
            assert (verdict["rank"], verdict["host"], verdict["gpu"]) == (CULPRIT, "node-b", 1), verdict
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

            incident = await _until("incident FR analysis", fr_done, 30, hang)
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

"""The end-to-end harness over real sockets: a torch.distributed gloo job (tests/integration/gloo_train.py)
of 8 CPU ranks with the probe, two real agents (4 fake GPU slots each) and a real aggregator on 127.0.0.1.

Ranks 0-3 run on node-a, 4-7 on node-b (LOCAL_RANK 0-3; without NVML pids the agent takes the GPU slot
from LOCAL_RANK), so rank r is on ``host_of(r)`` GPU ``r % GPUS_PER_HOST``. Shared by the hang
(test_gloo_e2e.py) and straggler (test_gloo_straggler_e2e.py) tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil

from sentinel.agent import Agent
from sentinel.config.agent import AgentConfig
from tests.agent.fakes import FakeSource
from tests.aggregator.helpers import TOKEN, Running
from tests.support import REPO

HOSTS = ("node-a", "node-b")
GPUS_PER_HOST = 4
WORLD = len(HOSTS) * GPUS_PER_HOST
#: until every rank of a run reports: 8 processes importing torch take ~10 s quiet and well over a minute on a
#: loaded 2-core machine (the import alone took 28-60 s each at load 5); the wait ends as soon as they report
START_WITHIN_S = 150.0


def host_of(rank: int) -> str:
    return HOSTS[rank // GPUS_PER_HOST]


def free_port() -> int:
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
            "port": free_port(),
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
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        self.log.close()
        left = [p for p in pids if alive(p)]
        assert not left, f"ranks still running: {left}"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        assert response.status == 200, f"{url}: HTTP {response.status}"
        return await response.json()


async def until(what: str, check: Any, timeout: float, job: Job | None = None) -> Any:
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
async def agents(
    cluster: Cluster,
    running: Running,
    *,
    gpus: int = GPUS_PER_HOST,
    configure: Callable[[str, AgentConfig], AgentConfig] | None = None,
) -> AsyncIterator[list[Agent]]:
    """One real agent per host of ``HOSTS`` (``configure`` may change each one's configuration)."""
    token = cluster.tmp / "token"
    token.write_text(TOKEN)
    agents = []
    for host in HOSTS:
        config = cluster.agent_config(host, running.stream_url, token)
        agents.append(Agent(configure(host, config) if configure else config, FakeSource(gpus=gpus)))
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        yield agents
    finally:
        for a in agents:
            a.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


async def all_ranks_report(session: aiohttp.ClientSession, url: str, job: Job) -> bool:
    async with session.get(f"{url}/api/v1/jobs/{job.id}") as response:
        if response.status != 200:
            return False
        detail = await response.json()
    ranks = detail.get("rank_list") or []
    return len(ranks) == WORLD and all(r.get("host") and r.get("gpu") is not None for r in ranks)


async def verdicts(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    """Every verdict the aggregator at ``url`` holds, open and closed."""
    return list((await get_json(session, f"{url}/api/v1/verdicts"))["verdicts"])


async def hang_until_stuck(
    session: aiohttp.ClientSession, url: str, job: Job, rank: int, within_s: float
) -> tuple[dict[str, Any], float]:
    """Stop ``rank`` before its next gradient all_reduce (CONTROL/hang: its peers enter it and wait) and
    wait for the aggregator's stuck verdict: (the verdict, when the rank stopped by its own clock)."""
    (job.control / "hang").write_text(str(rank))
    hung_file = job.control / f"hung_{rank}"

    async def stopped() -> bool:
        return hung_file.exists() and bool(hung_file.read_text())

    await until(f"rank {rank} stops", stopped, 10, job)
    stopped_at = float(hung_file.read_text())

    async def stuck_verdict() -> dict[str, Any] | None:
        return next((v for v in await verdicts(session, url) if v["kind"] == "stuck"), None)

    return await until("stuck verdict", stuck_verdict, within_s + 5, job), stopped_at

"""The real sentinel pieces for the end-to-end test: the aggregator as its daemon command
(``sentinel aggregator run --config FILE``, what systemd runs) and real agents, in this process, on the
simulator's hosts in real time, each serving /metrics on its own 127.0.0.1 port like a GPU host would."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.ops.stack import eventually, free_port
from tests.support import need

CLUSTER = "e2e"
AGENT_STOP_S = 6.0


def need_real_stack() -> None:
    """Skip (fail in CI) until the aggregator daemon and the real-time simulated hosts exist."""
    for module, what in (
        ("sentinel.cli.cmd_aggregator", "`sentinel aggregator run` (the aggregator daemon)"),
        ("sentinel.sim.host", "real-time simulated hosts (sentinel.sim.host.SimHost)"),
        ("sentinel.agent.agent", "the agent (sentinel.agent.agent.Agent)"),
    ):
        need(importlib.util.find_spec(module) is not None, f"{what} not available yet")


def write_token(directory: Path) -> Path:
    path = directory / "tokens"
    path.write_text(secrets.token_urlsafe(24) + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


@dataclass
class AggregatorProcess:
    port: int
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.asynccontextmanager
async def aggregator_process(workdir: Path, tokens_file: Path, port: int) -> AsyncIterator[AggregatorProcess]:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "aggregator.toml"
    config.write_text(
        "\n".join(
            [
                "[server]",
                'listen_host = "127.0.0.1"',
                f"listen_port = {port}",
                f'tokens_file = "{tokens_file}"',
                f'state_dir = "{workdir / "state"}"',
                "[fleet]",
                f'cluster = "{CLUSTER}"',
                "[log]",
                'level = "warning"',
                "",
            ]
        ),
        encoding="utf-8",
    )
    (workdir / "state").mkdir(exist_ok=True)
    log = workdir / "aggregator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "aggregator", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    running = AggregatorProcess(port=port, log=log, proc=proc)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:

            async def healthy() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"aggregator exited with {proc.returncode}:\n{running.log_tail()}")
                try:
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(healthy, timeout=20, what="aggregator /healthz")
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@dataclass
class SimulatedAgents:
    targets: list[str]
    agents: list[Any]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def simulated_agents(
    scenario_text: str, *, aggregator_port: int, token_file: Path, state_dir: Path, metrics_ports: list[int]
) -> AsyncIterator[SimulatedAgents]:
    """One real agent per simulated host of the scenario, streaming to the aggregator, /metrics on
    ``metrics_ports`` (one per host, in host order)."""
    from sentinel.agent.agent import Agent
    from sentinel.config.agent import (
        AgentConfig,
        AgentIdentity,
        CollectConfig,
        KmsgConfig,
        ProbeConfig,
        StreamConfig,
        SystemdConfig,
    )
    from sentinel.config.common import MetricsConfig
    from sentinel.sim.host import sim_hosts
    from sentinel.sim.scenario import load_scenario_text

    scenario = load_scenario_text(scenario_text, "e2e scenario")
    token = token_file.read_text(encoding="utf-8").split()[0]
    agent_token = state_dir / "token"
    state_dir.mkdir(parents=True, exist_ok=True)
    agent_token.write_text(token + "\n", encoding="utf-8")
    cluster, hosts = sim_hosts(scenario, started_at=time.time(), clock=time.time)
    assert len(hosts) == len(metrics_ports)
    agents = []
    for host, port in zip(hosts, metrics_ports, strict=True):
        (state_dir / host.name).mkdir(exist_ok=True)
        config = AgentConfig(
            agent=AgentIdentity(host=host.name, cluster=CLUSTER, state_dir=str(state_dir / host.name)),
            collect=CollectConfig(tick_s=scenario.tick_s, slow_tick_s=2.0, nvml_timeout_s=2.0),
            kmsg=KmsgConfig(enabled=False),
            probe=ProbeConfig(socket_path=""),
            stream=StreamConfig(
                aggregator_url=f"ws://127.0.0.1:{aggregator_port}/api/v1/stream",
                token_file=str(agent_token),
                backoff_initial_s=0.2,
                backoff_max_s=1.0,
            ),
            metrics=MetricsConfig(listen_host="127.0.0.1", listen_port=port),
            systemd=SystemdConfig(notify=False),
        )
        agents.append(Agent(config, host, host.inputs(), time.time))
    running = SimulatedAgents(targets=[f"127.0.0.1:{port}" for port in metrics_ports], agents=agents)
    by_name = {agent.host: agent for agent in agents}
    driver = asyncio.create_task(cluster.drive(lambda name: by_name[name].request_stop()), name="sim-driver")
    try:
        running.tasks = [asyncio.create_task(agent.run(), name=f"agent-{agent.host}") for agent in agents]
        yield running
    finally:
        for agent in agents:
            agent.request_stop()
        cluster.close()
        _, pending = await asyncio.wait(running.tasks, timeout=AGENT_STOP_S)
        for task in pending:
            task.cancel()
        driver.cancel()
        for task in [*running.tasks, driver]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]

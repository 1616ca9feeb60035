"""Where the demo plugs into the other parts: the aggregator's app, the simulator's hosts, the real agent.

Each is an async context manager that starts its part on entry and, on exit, stops it completely (tasks
cancelled and awaited, sockets closed), whatever happened in between — so Ctrl-C or an error in the middle of
a demo leaves nothing running and no traceback behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from sentinel.agent.agent import Agent
from sentinel.agent.source import GpuSource
from sentinel.aggregator.listener import AggregatorSite
from sentinel.aggregator.server import create_app, make_runner
from sentinel.config.agent import AgentConfig, StreamConfig
from sentinel.config.aggregator import AggregatorConfig
from sentinel.sim.host import SimCluster, simulated_agent_config
from sentinel.sim.scenario import HOST_GLOB, MAX_HOSTS, Scenario
from sentinel.web import status_page_routes

AGENT_STOP_S = 6.0


class DemoError(Exception):
    """A one-line reason the demo could not run (port taken, state folder unusable)."""


# -- aggregator -----------------------------------------------------------------------------------------


@dataclass
class RunningAggregator:
    port: int
    app: web.Application


def aggregator_config(state_dir: Path, tick_s: float) -> AggregatorConfig:
    """The aggregator's configuration for a demo: defaults, except where the demo keeps its state and a
    detector cadence no slower than the agents' ticks. Durable state is off: each demo run tells its own
    scenario from t=0, and a reused ``--state-dir`` must not bring back the verdicts of an earlier run."""
    config = AggregatorConfig()
    config.state.enabled = False
    config.server.listen_host = "127.0.0.1"
    config.server.state_dir = str(state_dir)
    config.fleet.cluster = "demo"
    config.fleet.tick_s = min(config.fleet.tick_s, tick_s)
    # every simulated agent connects from 127.0.0.1: the per-peer limits must admit the largest scenario
    config.limits.max_streams_per_peer = MAX_HOSTS
    config.limits.max_connections_per_peer = MAX_HOSTS + 1024  # the status page and API clients too
    return config


@contextlib.asynccontextmanager
async def aggregator(
    *,
    state_dir: Path,
    token: str,
    port: int,
    tick_s: float,
    clock: Callable[[], float],
    tune: Callable[[AggregatorConfig], None] | None = None,
) -> AsyncIterator[RunningAggregator]:
    """The real aggregator on 127.0.0.1:``port`` (0: a free one) with the status page at ``/``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    config = aggregator_config(state_dir, tick_s)
    if tune is not None:
        tune(config)
    app = create_app(
        config,
        tokens=[f"{token} {HOST_GLOB}"],  # bound to the simulated hosts, as a deployment's should be
        clock=clock,
        registry=CollectorRegistry(),
        state_dir=state_dir,
        extra_routes=status_page_routes(config.server.runbook_base_url),
    )
    runner = make_runner(app, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = AggregatorSite(runner, "127.0.0.1", port)
        try:
            await site.start()
        except OSError as exc:
            raise DemoError(f"aggregator cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
        yield RunningAggregator(port=_bound_port(runner), app=app)
    finally:
        await runner.cleanup()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("aggregator listener has no TCP address")


# -- agents on simulated hosts -------------------------------------------------------------------------


def agent_config(
    host: str, *, tick_s: float, stream_url: str, token_file: Path, state_dir: Path
) -> AgentConfig:
    """A real agent's configuration for one simulated host, streaming to the demo's aggregator (the
    simulator's agent settings, :func:`sentinel.sim.host.simulated_agent_config`)."""
    return simulated_agent_config(
        host,
        tick_s=tick_s,
        state_dir=str(state_dir),
        stream=StreamConfig(
            aggregator_url=stream_url,
            token_file=str(token_file),
            backoff_initial_s=0.2,
            backoff_max_s=2.0,
            connect_timeout_s=5.0,
            spool_max_bytes=16 * 1024 * 1024,
        ),
    )


@dataclass
class RunningCluster:
    host_names: list[str]
    agents: list[Agent]
    sim: SimCluster
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    down: list[str] = field(default_factory=list)  # hosts whose agent the scenario took down
    failed: str | None = None  # set when something the demo needs stopped on its own


@contextlib.asynccontextmanager
async def simulated_cluster(
    scenario: Scenario,
    *,
    started_at: float,
    clock: Callable[[], float],
    stream_url: str,
    token_file: Path,
    state_dir: Path,
) -> AsyncIterator[RunningCluster]:
    """The scenario's hosts, each watched by a real agent streaming to ``stream_url``, in real time."""
    sim = SimCluster(scenario, started_at=started_at, clock=clock)
    agents: list[Agent] = []
    for host in sim.hosts:
        (state_dir / host.name).mkdir(parents=True, exist_ok=True)
        config = agent_config(
            host.name,
            tick_s=scenario.tick_s,
            stream_url=stream_url,
            token_file=token_file,
            state_dir=state_dir / host.name,
        )
        # SimHost is a GpuSource; the cast covers list invariance of wait_xid_events' return type only
        agents.append(Agent(config, cast(GpuSource, host), host.inputs(), clock))
    by_name = {agent.host: agent for agent in agents}
    running = RunningCluster(host_names=[h.name for h in sim.hosts], agents=agents, sim=sim)

    def host_down(name: str) -> None:  # host_down: the host's agent goes quiet, as if the machine died
        running.down.append(name)
        agent = by_name.get(name)
        if agent is not None:
            agent.request_stop()

    def on_done(task: asyncio.Task[None]) -> None:
        if task.cancelled() or running.failed is not None:
            return
        exc = task.exception()
        if exc is not None:
            running.failed = f"{task.get_name()}: {type(exc).__name__}: {exc}"

    driver = asyncio.create_task(sim.drive(host_down), name="sim-driver")
    driver.add_done_callback(on_done)
    try:
        for agent in agents:
            # each agent's log lines name its own host (they all said host="demo"): its task runs in a
            # context of its own with the host bound
            context = contextvars.copy_context()
            context.run(structlog.contextvars.bind_contextvars, host=agent.host)
            task = asyncio.get_running_loop().create_task(
                agent.run(), name=f"agent-{agent.host}", context=context
            )
            task.add_done_callback(on_done)
            running.tasks.append(task)
        yield running
    finally:
        # agents first (they drain their streams and close their sockets), then the simulator under them
        for agent in agents:
            agent.request_stop()
        tasks = list(running.tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=AGENT_STOP_S)
            for task in pending:
                task.cancel()
        sim.close()  # releases simulated NVML calls that hang by design
        driver.cancel()
        for task in [*tasks, driver]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

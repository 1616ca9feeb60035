"""The host's health after one tick of the real agent over a given GPU source (``agent once --nvml-replay``).

The agent is built inline (no thread, no event loop, no socket, no state kept) with only its NVML collector,
so the GPU states, samples and batch come from the agent's own code, and the health document is the one
the agent serves to ``sentinel health`` (:meth:`sentinel.agent.agent.Agent.health_report`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from sentinel.agent.agent import Agent
from sentinel.agent.source import GpuSource
from sentinel.components.registry import COLLECTORS
from sentinel.config.agent import AgentConfig

#: every collector but the GPUs': a recording says nothing about this machine's kernel log, jobs or ports
_OTHERS: tuple[str, ...] = tuple(c for c in COLLECTORS if c != "nvml")


def health_after_one_tick(config: AgentConfig, source: GpuSource, now: float) -> dict[str, Any]:
    """The agent's health document (``GET /api/v1/health``) after one inline tick at ``now`` over ``source``."""
    replace = msgspec.structs.replace
    config = replace(
        config,
        agent=replace(config.agent, state_dir=""),
        collect=replace(config.collect, disabled=list(_OTHERS), nvml_events=False),
        metrics=replace(config.metrics, listen_host=config.metrics.listen_host or "127.0.0.1"),
        stream=replace(config.stream, enabled=False, coalesce_ticks=1),  # one tick: nothing held
        systemd=replace(config.systemd, notify=False),
    )
    agent = Agent(config, source, clock=lambda: now, inline=True)
    try:
        agent.step_inline(now)
        return agent.health_report()
    finally:
        source.close()

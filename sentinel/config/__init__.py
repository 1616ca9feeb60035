"""Configuration of the two daemons: one TOML file each, every key defaulted, ``SENTINEL_*`` overrides.

``DAEMONS`` names each daemon's struct, default path and environment prefix; ``sentinel config`` and the
daemons' start-up both go through :func:`load_daemon_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec

from sentinel.config.agent import AgentConfig
from sentinel.config.aggregator import AggregatorConfig
from sentinel.config.loader import ConfigError, load_config


@dataclass(frozen=True)
class DaemonConfigSpec:
    name: str
    struct: type[msgspec.Struct]
    default_path: Path
    env_prefix: str


DAEMONS: dict[str, DaemonConfigSpec] = {
    "agent": DaemonConfigSpec("agent", AgentConfig, Path("/etc/sentinel/agent.toml"), "SENTINEL_AGENT"),
    "aggregator": DaemonConfigSpec(
        "aggregator", AggregatorConfig, Path("/etc/sentinel/aggregator.toml"), "SENTINEL_AGGREGATOR"
    ),
}


def load_agent_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """The agent's config; the default path may be absent (all defaults), an explicit one must exist."""
    spec = DAEMONS["agent"]
    return load_config(
        AgentConfig, path or spec.default_path, env_prefix=spec.env_prefix, env=env, missing_ok=path is None
    )


def load_aggregator_config(path: Path | None, env: Mapping[str, str] | None = None) -> AggregatorConfig:
    """The aggregator's config; the default path may be absent (all defaults), an explicit one must exist."""
    spec = DAEMONS["aggregator"]
    return load_config(
        AggregatorConfig,
        path or spec.default_path,
        env_prefix=spec.env_prefix,
        env=env,
        missing_ok=path is None,
    )


__all__ = [
    "DAEMONS",
    "AgentConfig",
    "AggregatorConfig",
    "ConfigError",
    "DaemonConfigSpec",
    "load_agent_config",
    "load_aggregator_config",
    "load_config",
]

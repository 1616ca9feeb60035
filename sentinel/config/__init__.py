"""Configuration of the two daemons: one TOML file each, every key defaulted, ``SENTINEL_*`` overrides.

``DAEMONS`` names each daemon's struct, default path and environment prefix; ``sentinel config`` and the
daemons' start-up both go through :func:`load_daemon_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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


T = TypeVar("T", bound=msgspec.Struct)


def load_daemon_config(
    name: str, cls: type[T], path: Path, *, env: Mapping[str, str] | None = None, missing_ok: bool = False
) -> T:
    """``load_config`` for daemon ``name``; a file that is the *other* daemon's configuration says so."""
    spec = DAEMONS[name]
    try:
        return load_config(cls, path, env_prefix=spec.env_prefix, env=env, missing_ok=missing_ok)
    except ConfigError as exc:
        if exc.problem == "unknown key":
            for other in DAEMONS.values():
                if other.name == name:
                    continue
                try:
                    load_config(other.struct, path, env_prefix=other.env_prefix, env={}, missing_ok=False)
                except ConfigError:
                    continue
                raise ConfigError(
                    exc.source,
                    exc.key,
                    f"unknown key; this file looks like the {other.name}'s configuration, not the {name}'s "
                    f"(sentinel config check --daemon {other.name} {path})",
                ) from None
        raise


def load_agent_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """The agent's config; the default path may be absent (all defaults), an explicit one must exist."""
    spec = DAEMONS["agent"]
    return load_daemon_config(
        "agent", AgentConfig, path or spec.default_path, env=env, missing_ok=path is None
    )


def load_aggregator_config(path: Path | None, env: Mapping[str, str] | None = None) -> AggregatorConfig:
    """The aggregator's config; the default path may be absent (all defaults), an explicit one must exist."""
    spec = DAEMONS["aggregator"]
    return load_daemon_config(
        "aggregator", AggregatorConfig, path or spec.default_path, env=env, missing_ok=path is None
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
    "load_daemon_config",
]

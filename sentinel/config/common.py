"""Configuration blocks both daemons share."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class LogConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Logging: JSON lines to stderr when it is not a terminal (journald), readable text on a terminal."""

    level: Annotated[LogLevel, msgspec.Meta(description="minimum level written")] = "info"


class MetricsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Prometheus exposition of this daemon's own ``/metrics``."""

    listen_host: Annotated[
        str, msgspec.Meta(description="address the /metrics endpoint binds to; empty disables it")
    ] = "127.0.0.1"
    listen_port: Annotated[
        int, msgspec.Meta(ge=0, le=65535, description="port of /metrics (0: any free)")
    ] = 9401


def check_names(kind: str, names: list[str]) -> None:
    """Every name in ``names`` is one of the registry's ``kind`` (``collectors`` / ``detectors``): a
    ``ValueError`` naming the first unknown one otherwise (msgspec reports it under the key being read)."""
    if not names:
        return
    from sentinel.components import registry  # the signals' modules: only when something is named

    known: tuple[str, ...] = registry.COLLECTORS if kind == "collectors" else registry.DETECTORS
    for i, name in enumerate(names):
        if name not in known:
            raise ValueError(f"disabled[{i}]: {name!r} is not a {kind[:-1]} (one of {', '.join(known)})")

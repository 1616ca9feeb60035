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

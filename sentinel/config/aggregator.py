"""The aggregator's configuration (``/etc/sentinel/aggregator.toml``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from sentinel.config.common import LogConfig


class ServerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """HTTP API, status page, /metrics and the agents' WebSocket stream share one listener."""

    listen_host: Annotated[str, msgspec.Meta(description="bind address")] = "127.0.0.1"
    listen_port: Annotated[int, msgspec.Meta(ge=0, le=65535, description="bind port (0: any free)")] = 9400
    tokens_file: Annotated[
        str, msgspec.Meta(description="file with the accepted agent bearer tokens, one per line")
    ] = "/etc/sentinel/tokens"
    state_dir: Annotated[str, msgspec.Meta(description="incidents database and timelines")] = (
        "/var/lib/sentinel"
    )


class AggregatorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything ``sentinel aggregator`` reads from its TOML file."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)

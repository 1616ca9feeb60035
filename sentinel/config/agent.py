"""The agent's configuration (``/etc/sentinel/agent.toml``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from sentinel.config.common import LogConfig, MetricsConfig


class AgentIdentity(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who this agent is and where it keeps state."""

    host: Annotated[
        str, msgspec.Meta(description="host name reported to the aggregator; empty: the system's")
    ] = ""
    cluster: Annotated[str, msgspec.Meta(description="cluster label attached to every metric")] = "default"
    state_dir: Annotated[str, msgspec.Meta(description="directory for the spool and other state")] = (
        "/var/lib/sentinel"
    )


class CollectConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GPU collection cadence and deadlines."""

    tick_s: Annotated[
        float, msgspec.Meta(ge=0.05, le=60, description="sampling interval of fast NVML metrics")
    ] = 1.0
    slow_tick_s: Annotated[
        float,
        msgspec.Meta(ge=0.05, le=3600, description="interval of slow counters (ECC, row remap, NVLink)"),
    ] = 10.0
    nvml_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=60, description="an NVML call not returned by then marks the GPU unresponsive"),
    ] = 2.0


class StreamConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The WebSocket stream to the aggregator."""

    aggregator_url: Annotated[
        str, msgspec.Meta(description="ws:// or wss:// URL of the aggregator's stream")
    ] = "ws://127.0.0.1:9400/api/v1/stream"
    token_file: Annotated[str, msgspec.Meta(description="file holding the bearer token")] = (
        "/etc/sentinel/token"
    )
    ca_file: Annotated[
        str, msgspec.Meta(description="CA bundle to verify a wss:// aggregator; empty: system")
    ] = ""
    spool_max_bytes: Annotated[
        int, msgspec.Meta(ge=0, description="on-disk spool bound while the aggregator is unreachable")
    ] = 256 * 1024 * 1024


class RingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The host's flight-recorder ring buffer of recent samples and events."""

    window_s: Annotated[float, msgspec.Meta(ge=10, le=86400, description="history kept, seconds")] = 900.0
    max_bytes: Annotated[int, msgspec.Meta(ge=1 << 16, description="memory bound of the ring buffer")] = (
        64 * 1024 * 1024
    )


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything ``sentinel agent`` reads from its TOML file."""

    agent: AgentIdentity = msgspec.field(default_factory=AgentIdentity)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    collect: CollectConfig = msgspec.field(default_factory=CollectConfig)
    stream: StreamConfig = msgspec.field(default_factory=StreamConfig)
    ring: RingConfig = msgspec.field(default_factory=RingConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)

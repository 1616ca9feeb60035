"""The agent's configuration (``/etc/sentinel/agent.toml``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from sentinel.config.common import LogConfig, MetricsConfig, check_names


class AgentIdentity(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who this agent is and where it keeps state."""

    host: Annotated[
        str, msgspec.Meta(description="host name reported to the aggregator; empty: the system's")
    ] = ""
    cluster: Annotated[str, msgspec.Meta(description="cluster label attached to every metric")] = "default"
    state_dir: Annotated[str, msgspec.Meta(description="directory for the spool and other state")] = (
        "/var/lib/sentinel"
    )


#: A collector's name: one of :data:`sentinel.components.registry.COLLECTORS`, checked while the file is read
#: (:meth:`CollectConfig.__post_init__`), never at run time; the docs list the registry's names.
CollectorName = Annotated[str, msgspec.Meta(max_length=64, extra={"names": "collectors"})]


class CollectConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GPU collection cadence and deadlines."""

    disabled: Annotated[
        list[CollectorName],
        msgspec.Meta(
            max_length=16,
            description="collectors switched off (not built, not run, no metrics of theirs); on-call's way to "
            'silence a collector that misbehaves on a host (e.g. ["ib"]). Without nvml the agent reads no GPU '
            "(and neither xid), so `sentinel health` cannot tell",
        ),
    ] = []

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
    procs_interval_s: Annotated[
        float,
        msgspec.Meta(ge=0.05, le=3600, description="interval of the GPU process → job/rank mapping"),
    ] = 5.0
    xid_dedup_window_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=600,
            description="the same (GPU, Xid) seen by NVML and the kernel log within it is one event",
        ),
    ] = 10.0
    expected_gpus: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=1024,
            description="GPUs this host must have; fewer (or NVML unusable) is a host verdict. 0: learned from "
            "the host's first inventory and kept in the state directory",
        ),
    ] = 0
    xid_flood_window_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=600,
            description="repeats of one Xid line (same GPU, code, process and text) within this many seconds "
            "of its first occurrence are sent as one event with their count, one event per window for as long "
            "as the flood lasts; the first occurrence is sent at once. 0: every occurrence is an event",
        ),
    ] = 10.0
    xid_merge_wait_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=30,
            description="how long an Xid reported by one source (NVML or the kernel log) waits for the other's "
            "report of it before it is sent alone; the merged event keeps the kernel line's detail and NVML's time",
        ),
    ] = 2.0
    nvml_events: Annotated[
        bool, msgspec.Meta(description="listen for Xid events on an NVML event set (a dedicated thread)")
    ] = True

    def __post_init__(self) -> None:
        check_names("collectors", self.disabled)


class KmsgConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The kernel log, read from its end, for NVRM Xid lines and other GPU driver messages."""

    enabled: Annotated[bool, msgspec.Meta(description="read the kernel log")] = True
    path: Annotated[str, msgspec.Meta(description="kernel log device (a plain file works for tests)")] = (
        "/dev/kmsg"
    )
    max_records_per_tick: Annotated[
        int, msgspec.Meta(ge=1, le=100000, description="records read per tick at most (the rest next tick)")
    ] = 2000


class LogsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """NCCL / PyTorch log files tailed and classified."""

    globs: Annotated[
        list[str],
        msgspec.Meta(
            description="file patterns to tail, e.g. the NCCL_DEBUG_FILE pattern or job log folders"
        ),
    ] = []
    rescan_s: Annotated[
        float,
        msgspec.Meta(ge=0.1, le=3600, description="how often the patterns are re-expanded for new files"),
    ] = 5.0
    max_line_bytes: Annotated[
        int, msgspec.Meta(ge=128, le=1 << 20, description="longer lines are cut to this (and counted)")
    ] = 8192
    max_bytes_per_tick: Annotated[
        int, msgspec.Meta(ge=4096, description="bytes read per file per tick at most (the rest next tick)")
    ] = 4 * 1024 * 1024
    max_files: Annotated[int, msgspec.Meta(ge=1, le=100000, description="files followed at most")] = 1024
    forward_info: Annotated[
        bool, msgspec.Meta(description="also forward info-severity classified lines (NCCL INFO) as events")
    ] = False


class ProbeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The local socket on which training processes hand over flight-recorder heads, and FR dumps."""

    socket_path: Annotated[
        str, msgspec.Meta(description="unix datagram socket for FrHeads; empty disables it")
    ] = "/run/sentinel/probe.sock"
    socket_mode: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=0o777,
            description="permission bits of the socket file (0660: the agent's user and socket_group); "
            "whoever can write is still checked against the job's processes by its kernel credentials",
        ),
    ] = 0o660
    socket_group: Annotated[
        str,
        msgspec.Meta(
            description="group given the socket file, e.g. the group of the users who run training jobs; "
            "empty: the agent's own group"
        ),
    ] = ""
    max_datagram_bytes: Annotated[
        int, msgspec.Meta(ge=256, le=1 << 20, description="larger datagrams are dropped")
    ] = 65536
    max_pending: Annotated[
        int, msgspec.Meta(ge=1, le=100000, description="heads queued for the next batch at most")
    ] = 4096
    max_pending_bytes: Annotated[
        int,
        msgspec.Meta(
            ge=1 << 16,
            le=1 << 30,
            description="memory of decoded heads queued for the next batch at most, estimated (the oldest are dropped "
            "first; a flood of 64 KiB datagrams once took the agent from 44 to 663 MB)",
        ),
    ] = 4 * 1024 * 1024
    fr_dump_dir: Annotated[
        str, msgspec.Meta(description="folder PyTorch writes FR dumps into; empty: do not watch")
    ] = ""
    fr_dump_prefix: Annotated[
        str, msgspec.Meta(description="file name prefix of FR dumps (TORCH_FR_DUMP_TEMP_FILE's last part)")
    ] = "nccl_trace_rank_"
    fr_pipe_prefix: Annotated[
        str,
        msgspec.Meta(description="TORCH_NCCL_DEBUG_INFO_PIPE_FILE prefix; fr_dump writes to <prefix><rank>"),
    ] = ""


class StreamConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The WebSocket stream to the aggregator."""

    def urls(self) -> list[str]:
        """The aggregators to stream to: ``aggregator_urls``, else the single ``aggregator_url``."""
        return list(dict.fromkeys(self.aggregator_urls)) or [self.aggregator_url]

    enabled: Annotated[bool, msgspec.Meta(description="stream to the aggregator at all")] = True
    aggregator_url: Annotated[
        str, msgspec.Meta(description="ws:// or wss:// URL of the aggregator's stream")
    ] = "ws://127.0.0.1:9400/api/v1/stream"
    aggregator_urls: Annotated[
        list[Annotated[str, msgspec.Meta(pattern=r"^wss?://\S+$")]],
        msgspec.Meta(
            max_length=8,
            description="stream to every one of these aggregators (high availability: each has its own "
            "acks and spool cursor, a batch leaves the spool once all have it); empty: aggregator_url alone",
        ),
    ] = []
    token_file: Annotated[str, msgspec.Meta(description="file holding the bearer token")] = (
        "/etc/sentinel/token"
    )
    ca_file: Annotated[
        str, msgspec.Meta(description="CA bundle to verify a wss:// aggregator; empty: system")
    ] = ""
    tls_cert_file: Annotated[
        str,
        msgspec.Meta(
            description="PEM client certificate for an aggregator that wants mutual TLS; empty: none"
        ),
    ] = ""
    tls_key_file: Annotated[str, msgspec.Meta(description="PEM private key of tls_cert_file")] = ""
    spool_max_bytes: Annotated[
        int, msgspec.Meta(ge=0, description="on-disk spool bound while the aggregator is unreachable")
    ] = 256 * 1024 * 1024
    backoff_initial_s: Annotated[
        float, msgspec.Meta(gt=0, le=60, description="first reconnect delay (doubles, jittered)")
    ] = 0.5
    backoff_max_s: Annotated[float, msgspec.Meta(gt=0, le=3600, description="reconnect delay cap")] = 30.0
    connect_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, le=600, description="WebSocket connect/handshake deadline")
    ] = 10.0
    max_inflight: Annotated[
        int, msgspec.Meta(ge=1, le=100000, description="batches sent and not yet acked at most")
    ] = 256
    coalesce_ticks: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=10,
            description="routine ticks (fast GPU samples only, every GPU state ok) are held and sent with the "
            "next batch, at most this many ticks in one batch; anything else (an event, FR heads, a process "
            "map, a slow reading, port/netdev/fabric manager/RAS readings, drops, a GPU source change) sends "
            "at once with what was held; 1 sends every tick at once. Above 1 it cuts the aggregator's "
            "per-batch cost on large clusters; samples then arrive up to this many ticks minus one late "
            "(keep it times collect.tick_s well under the aggregator's fleet.host_silent_after_s)",
        ),
    ] = 1


class RingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The host's flight-recorder ring buffer of recent samples and events."""

    window_s: Annotated[float, msgspec.Meta(ge=10, le=86400, description="history kept, seconds")] = 900.0
    max_bytes: Annotated[int, msgspec.Meta(ge=1 << 16, description="memory bound of the ring buffer")] = (
        64 * 1024 * 1024
    )


class SystemdConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Notifications to systemd (Type=notify, WatchdogSec=) when NOTIFY_SOCKET is set."""

    notify: Annotated[bool, msgspec.Meta(description="send READY/WATCHDOG/STATUS when run by systemd")] = True


class IbConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """InfiniBand / RoCE ports read from sysfs (state, rate, counters, the GPUs each port serves)."""

    enabled: Annotated[bool, msgspec.Meta(description="read the IB/RoCE ports")] = True
    sysfs_root: Annotated[
        str, msgspec.Meta(description="where sysfs is mounted (a container may see the host's elsewhere)")
    ] = "/sys"
    interval_s: Annotated[
        float,
        msgspec.Meta(
            ge=0.05,
            le=3600,
            description="read interval; link_downed counts the losses of link in between, so a short bounce "
            "is never missed, only timed less precisely",
        ),
    ] = 2.0
    flap_window_s: Annotated[
        float,
        msgspec.Meta(
            ge=10, le=86400, description="losses of link are remembered this long (kept across restarts)"
        ),
    ] = 600.0
    error_window_s: Annotated[
        float,
        msgspec.Meta(ge=60, le=7 * 86400, description="window of the per-hour error budgets (symbol errors)"),
    ] = 3600.0


class NetdevConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Network interfaces read from sysfs (``class/net/*/statistics``): the traffic of socket-transport jobs."""

    enabled: Annotated[bool, msgspec.Meta(description="read the network interfaces")] = True
    sysfs_root: Annotated[
        str, msgspec.Meta(description="where sysfs is mounted (its class/net shows the mounter's namespace)")
    ] = "/sys"
    interval_s: Annotated[
        float,
        msgspec.Meta(ge=0.05, le=3600, description="read interval (rates are per second between reads)"),
    ] = 2.0
    qdiscs: Annotated[
        bool, msgspec.Meta(description="also read each interface's root qdisc (rtnetlink): its egress wait")
    ] = True
    netns: Annotated[
        str,
        msgspec.Meta(
            max_length=256,
            description="read the qdiscs of this network namespace (e.g. /proc/1/ns/net from a container; "
            "needs CAP_SYS_ADMIN); empty: the agent's own. Point sysfs_root at a sysfs mounted from it",
        ),
    ] = ""


class FabricManagerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The NVSwitch fabric manager's service (``systemctl show nvidia-fabricmanager``), where the unit exists."""

    enabled: Annotated[bool, msgspec.Meta(description="read the fabric manager's service state")] = True
    interval_s: Annotated[
        float,
        msgspec.Meta(
            ge=1,
            le=3600,
            description="read interval while the unit exists (a host without it asks again every 5 minutes)",
        ),
    ] = 15.0


class NcclRasConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Queries of NCCL's RAS service (NCCL >= 2.24) while a job's rank 0 runs on the host."""

    enabled: Annotated[bool, msgspec.Meta(description="query the local RAS service")] = True
    host: Annotated[str, msgspec.Meta(description="RAS address (NCCL_RAS_ADDR's host)")] = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=1, le=65535, description="RAS port (NCCL_RAS_ADDR's port)")] = 28028
    interval_s: Annotated[
        float,
        msgspec.Meta(
            ge=1, le=3600, description="query interval (each query makes RAS gather data from the whole job)"
        ),
    ] = 15.0
    timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=120, description="the whole query's deadline (connect, handshake, answer)"),
    ] = 8.0
    refused_backoff_s: Annotated[
        float, msgspec.Meta(ge=1, le=3600, description="retry delay when nothing listens on the port")
    ] = 60.0


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything ``sentinel agent`` reads from its TOML file."""

    agent: AgentIdentity = msgspec.field(default_factory=AgentIdentity)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    collect: CollectConfig = msgspec.field(default_factory=CollectConfig)
    kmsg: KmsgConfig = msgspec.field(default_factory=KmsgConfig)
    logs: LogsConfig = msgspec.field(default_factory=LogsConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    stream: StreamConfig = msgspec.field(default_factory=StreamConfig)
    ring: RingConfig = msgspec.field(default_factory=RingConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    systemd: SystemdConfig = msgspec.field(default_factory=SystemdConfig)
    ib: IbConfig = msgspec.field(default_factory=IbConfig)
    netdev: NetdevConfig = msgspec.field(default_factory=NetdevConfig)
    fabric_manager: FabricManagerConfig = msgspec.field(default_factory=FabricManagerConfig)
    nccl_ras: NcclRasConfig = msgspec.field(default_factory=NcclRasConfig)

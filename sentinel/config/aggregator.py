"""The aggregator's configuration (``/etc/sentinel/aggregator.toml``).

Detector thresholds live here, each with the reason for its default, so that operators tune them in one
file and ``sentinel sim`` runs the very same defaults.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from sentinel.components.device.inventory import InventoryConfig
from sentinel.components.ecc.rule import EccThresholds
from sentinel.components.fabric.domain import FabricDomainConfig
from sentinel.components.fabric.host import FabricRuleConfig
from sentinel.components.ib.rule import PortRuleConfig
from sentinel.components.linkpace.rule import LinkPaceConfig
from sentinel.components.xid.rule import XidPolicyConfig
from sentinel.config.common import LogConfig, check_names


class ServerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """HTTP API, status page, /metrics and the agents' WebSocket stream share one listener."""

    listen_host: Annotated[str, msgspec.Meta(description="bind address")] = "127.0.0.1"
    listen_port: Annotated[int, msgspec.Meta(ge=0, le=65535, description="bind port (0: any free)")] = 9400
    tokens_file: Annotated[
        str, msgspec.Meta(description="agent credentials, one per line: TOKEN HOSTGLOB [HOSTGLOB ...]")
    ] = "/etc/sentinel/tokens"
    state_dir: Annotated[
        str,
        msgspec.Meta(
            description="incidents database and timelines, durable state (state.sqlite3); its own directory, "
            "never the agent's /var/lib/sentinel, also when run outside systemd"
        ),
    ] = "/var/lib/sentinel-aggregator"
    reuse_port: Annotated[
        bool,
        msgspec.Meta(
            description="bind listen_port with SO_REUSEPORT, so that several aggregator processes on one "
            "machine share it and the kernel spreads the agents' connections among them; each process is a "
            "whole engine for the hosts it accepts and needs its own state_dir. A host's reconnect may land "
            "on another process, and a job's ranks are split between them (its stuck and straggler detectors "
            "see only part of it): docs/aggregator.md, 'More than one core on one machine'"
        ),
    ] = False
    api_token_file: Annotated[
        str,
        msgspec.Meta(
            description="file of read tokens (one per line) the REST API (/api/v1/*, incidents included) "
            "requires as Authorization: Bearer; empty: the API is open to whoever reaches the port. "
            "/healthz, /metrics and the agents' stream are not affected",
        ),
    ] = ""
    api_page_size: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=100000,
            description="most items in one REST answer (?limit= asks for fewer; ?offset= pages on, next_offset "
            "says where); /api/v1/hosts at 3,500 hosts was 40 MiB built in one go on the event loop",
        ),
    ] = 1000
    tls_cert_file: Annotated[
        str, msgspec.Meta(description="PEM certificate chain to serve https/wss; empty: plain http/ws")
    ] = ""
    tls_key_file: Annotated[str, msgspec.Meta(description="PEM private key of tls_cert_file")] = ""
    tls_client_ca_file: Annotated[
        str,
        msgspec.Meta(
            description="mutual TLS: agents must present a certificate signed by this CA (needs tls_cert_file); "
            "empty: no client certificates"
        ),
    ] = ""
    tls_client_cert_names_host: Annotated[
        bool,
        msgspec.Meta(
            description="with mutual TLS, an agent may only speak for a host its certificate names "
            "(a DNS subjectAltName or the common name), on top of its token's host globs"
        ),
    ] = True
    runbook_base_url: Annotated[
        str,
        msgspec.Meta(
            max_length=2048,
            description="where the status page links a verdict's runbook: this prefix + the runbook's file "
            "name (docs/runbooks/ in the repository); point it at your docs server or repository browser, "
            "like the alert rules' runbook_url (docs/deploy.md)",
        ),
    ] = "docs/runbooks/"


class FleetConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the aggregator keeps time over the fleet."""

    cluster: Annotated[str, msgspec.Meta(description="cluster label on the aggregator's own metrics")] = (
        "default"
    )
    tick_s: Annotated[
        float,
        msgspec.Meta(
            ge=0.05,
            le=60,
            description="detector cadence; agents sample at 1 s, so 1 s keeps verdicts within a tick",
        ),
    ] = 1.0
    host_silent_after_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=3600,
            description="no frame from a host for this long opens host_silent (10 agent ticks: survives a "
            "reconnect with backoff, still well inside a PyTorch collective timeout)",
        ),
    ] = 10.0
    job_gone_after_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=86400,
            description="a job with no process and no heads reported for this long has ended; its verdicts close",
        ),
    ] = 30.0
    host_forget_after_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="a disconnected host silent this long is forgotten (its verdicts close): hosts that "
            "were decommissioned or renamed do not hold memory for ever. When limits.max_hosts is reached, the "
            "longest-silent disconnected host (silent past host_silent_after_s) makes room for a new one",
        ),
    ] = 7 * 86400.0
    gc_freeze_interval_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="move every object out of the garbage collector's reach this often (0: never; "
            "reference cycles among them wait for fleet.gc_full_interval_s): at two 24,576-rank jobs ~25,000 "
            "heads a second make young collections of what is not frozen pause the event loop up to 0.2 s",
        ),
    ] = 1.0
    gc_full_interval_s: Annotated[
        float,
        msgspec.Meta(
            ge=0, description="a full collection (one pause) this often, to reclaim cyclic garbage (0: never)"
        ),
    ] = 3600.0
    closed_verdicts_kept: Annotated[
        int, msgspec.Meta(ge=0, le=1_000_000, description="closed verdicts kept for the API (oldest dropped)")
    ] = 10000


class LimitsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Bounds on what agents may send; anything over a bound closes that agent's connection only."""

    max_frame_bytes: Annotated[
        int,
        msgspec.Meta(
            ge=1024, le=64 * 1024 * 1024, description="largest WebSocket message (close 1009 over it)"
        ),
    ] = 8 * 1024 * 1024
    max_samples_per_batch: Annotated[
        int,
        msgspec.Meta(ge=1, description="GPU samples in one batch (a spooled backlog of 16 GPUs x 600 ticks)"),
    ] = 16 * 600
    max_events_per_batch: Annotated[int, msgspec.Meta(ge=1, description="events in one batch")] = 10000
    max_heads_per_batch: Annotated[
        int, msgspec.Meta(ge=1, description="flight-recorder heads in one batch")
    ] = 4096
    max_procs_per_batch: Annotated[
        int,
        msgspec.Meta(
            ge=1, description="GPU processes in one batch (64 GPUs x 64 processes; 240k stalled ingest 0.6 s)"
        ),
    ] = 4096
    max_heads_items_per_batch: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="process groups + group ranks + in-flight entries over all heads of one batch "
            "(a host's 8 ranks x a few groups of a few thousand ranks)",
        ),
    ] = 262144
    max_gpus_per_host: Annotated[int, msgspec.Meta(ge=1, le=1024, description="GPUs a hello may declare")] = (
        64
    )
    max_hosts: Annotated[
        int, msgspec.Meta(ge=1, description="distinct hosts remembered (a new one beyond: 1008)")
    ] = 65536
    max_jobs: Annotated[
        int, msgspec.Meta(ge=1, description="jobs tracked at once (more are ignored and counted)")
    ] = 10000
    max_ranks_per_job: Annotated[int, msgspec.Meta(ge=1, description="ranks tracked per job")] = 131072
    max_connections: Annotated[
        int, msgspec.Meta(ge=1, description="concurrent agent connections (one per host; 503 beyond)")
    ] = 20000
    max_streams_per_peer: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="agent streams from one IP address at once (one per host; 503 beyond), so one peer "
            "cannot fill max_connections (a simulated fleet on one machine needs one per simulated host)",
        ),
    ] = 512
    max_connections_per_peer: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="TCP connections from one IP address at once, counted at accept before anything is "
            "read (streams, REST, idle or half-open sockets, TLS handshakes); one more is closed at once and "
            "counted as peer_connection_limit. Keep it above max_streams_per_peer",
        ),
    ] = 1024
    header_timeout_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=600,
            description="a TCP connection must complete its HTTP request headers within this long (and an idle "
            "keep-alive connection is closed after it): idle sockets cannot pile up",
        ),
    ] = 10.0
    hello_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=600, description="after the upgrade, the Hello must arrive within this long"),
    ] = 10.0
    idle_timeout_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=86400,
            description="a stream that sends nothing for this long is closed (agents send a batch every tick)",
        ),
    ] = 120.0
    max_clock_skew_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="samples and heads stamped further ahead of the aggregator's clock are ignored and "
            "counted (one sample a year ahead once froze a GPU's state: every later sample looked old)",
        ),
    ] = 300.0
    max_pending_commands: Annotated[
        int, msgspec.Meta(ge=1, description="commands awaiting an agent's answer, fleet-wide")
    ] = 4096


class HardwareConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-GPU hardware rules (Xid codes themselves follow the signals policy)."""

    nvlink_errors_per_s: Annotated[
        float,
        msgspec.Meta(
            ge=0, description="NVLink CRC+replay errors per second over the window that mark the GPU degraded"
        ),
    ] = 1.0
    pcie_replays_per_s: Annotated[
        float,
        msgspec.Meta(ge=0, description="PCIe replays per second over the window that mark the GPU degraded"),
    ] = 1.0
    rate_window_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600, description="window over which error counters are turned into rates"),
    ] = 30.0
    lost_cause_wait_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=60,
            description="a GPU NVML calls lost (GPU_IS_LOST) is named gpu_lost only once its agent has reported "
            "this long past the loss with no fatal Xid: the Xid 79 that is the cause (the lost state is its "
            "symptom) may come a batch or two later, held by the agent for its kernel-log twin up to "
            "collect.xid_merge_wait_s (2 s). Within the 3 s in which a lost GPU must be named",
        ),
    ] = 2.0


class StuckConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Collective-progress rules."""

    min_wait_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="peers waiting in one collective this long mean a stall (a healthy step's collectives "
            "take well under a second; 4 s leaves room to name the culprit within 10 s)",
        ),
    ] = 4.0
    heads_fresh_s: Annotated[
        float,
        msgspec.Meta(gt=0, description="heads older than this are not extrapolated (probe sends every 2 s)"),
    ] = 5.0
    unexplained_wait_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="every rank inside one collective with no rank, NCCL or NVLink evidence: a stall only "
            "after this long (a large collective or a checkpoint barrier legitimately takes tens of seconds)",
        ),
    ] = 120.0
    net_error_window_s: Annotated[
        float,
        msgspec.Meta(gt=0, description="NCCL NET errors this recent explain a collective nobody completes"),
    ] = 120.0
    max_culprits: Annotated[
        int, msgspec.Meta(ge=1, description="verdicts opened per stalled job at most")
    ] = 16


class StragglerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Peer comparison with robust statistics."""

    eval_interval_s: Annotated[
        float, msgspec.Meta(gt=0, description="how often the peer comparison runs")
    ] = 5.0
    ema_window_s: Annotated[
        float, msgspec.Meta(gt=0, description="time constant of the per-GPU moving averages compared")
    ] = 15.0
    z_threshold: Annotated[
        float,
        msgspec.Meta(gt=0, description="robust z (|x - median| / 1.4826·MAD) beyond which a GPU stands out"),
    ] = 6.0
    min_clock_drop: Annotated[
        float, msgspec.Meta(ge=0, le=1, description="SM clock at least this fraction under the peer median")
    ] = 0.08
    compute_window_steps: Annotated[
        int,
        msgspec.Meta(
            ge=4,
            le=1024,
            description="steps of each rank's compute time remembered; the median over them is compared "
            "(32: a 1.2x straggler moves it within ~20 steps, a 2-3 s pause never does)",
        ),
    ] = 32
    min_steps: Annotated[
        int, msgspec.Meta(ge=3, le=1024, description="steps a rank must have reported before it is judged")
    ] = 12
    min_slowdown: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=10,
            description="a rank's median compute per step at least this fraction over the job's median rank",
        ),
    ] = 0.07
    compute_z_threshold: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="and its robust z (median of medians, 1.4826*MAD) at least this: the ranks' own "
            "spread decides what is noise (+-20% jitter per step still leaves 1.2x at z > 5)",
        ),
    ] = 4.0
    host_share: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=1,
            description="this share of a host's GPUs (and at least two) slow together is one host verdict",
        ),
    ] = 0.5
    persistence: Annotated[
        int,
        msgspec.Meta(ge=1, description="consecutive evaluations a GPU must stand out before a verdict opens"),
    ] = 4
    min_peers: Annotated[int, msgspec.Meta(ge=3, description="fewest peers a comparison needs")] = 4
    min_hosts: Annotated[
        int,
        msgspec.Meta(
            ge=2,
            le=100000,
            description="the quorum of the fleet's SM clock comparison: distinct hosts whose busy GPUs of a model "
            "make its median (each host one vote, its GPUs weighted 1/n, so a host claiming 64 GPUs moves it "
            "as one with 8 does)",
        ),
    ] = 3
    max_clock_rate_error: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=1,
            description="ranks on a host whose clock runs faster or slower than the aggregator's by more than "
            "this share (measured from its batches' stamps) are not judged by compute time: their step times "
            "are in a wrong unit. The host is reported as clock skew (sentinel_host_clock_rate, "
            "SentinelHostClockSkew), not as slow",
        ),
    ] = 0.02


#: A detector's name: one of :data:`sentinel.components.registry.DETECTORS`, checked while the file is read
#: (:meth:`DetectConfig.__post_init__`); the docs list the registry's names.
DetectorName = Annotated[str, msgspec.Meta(max_length=64, extra={"names": "detectors"})]


class DetectConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Thresholds of the detectors, one section each."""

    disabled: Annotated[
        list[DetectorName],
        msgspec.Meta(
            max_length=16,
            description="detectors switched off (their open verdicts close); on-call's way to silence a "
            "misbehaving rule: edit, then SIGHUP the aggregator",
        ),
    ] = []

    hardware: HardwareConfig = msgspec.field(default_factory=HardwareConfig)
    xid: XidPolicyConfig = msgspec.field(default_factory=XidPolicyConfig)
    ecc: EccThresholds = msgspec.field(default_factory=EccThresholds)
    stuck: StuckConfig = msgspec.field(default_factory=StuckConfig)
    straggler: StragglerConfig = msgspec.field(default_factory=StragglerConfig)
    network: PortRuleConfig = msgspec.field(default_factory=PortRuleConfig)
    link_pace: LinkPaceConfig = msgspec.field(default_factory=LinkPaceConfig)
    inventory: InventoryConfig = msgspec.field(default_factory=InventoryConfig)
    fabric_domain: FabricDomainConfig = msgspec.field(default_factory=FabricDomainConfig)
    fabric: FabricRuleConfig = msgspec.field(default_factory=FabricRuleConfig)

    def __post_init__(self) -> None:
        check_names("detectors", self.disabled)


class IncidentsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The distributed flight recorder: snapshots of every agent involved, merged into one timeline."""

    enabled: Annotated[bool, msgspec.Meta(description="collect incident timelines")] = True
    window_s: Annotated[
        float, msgspec.Meta(gt=0, le=86400, description="history before the verdict each agent is asked for")
    ] = 300.0
    snapshot_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, le=600, description="how long to wait for the agents' snapshots")
    ] = 15.0
    max_hosts: Annotated[int, msgspec.Meta(ge=1, description="agents asked per incident at most")] = 256
    max_entries: Annotated[int, msgspec.Meta(ge=1, description="timeline entries kept per incident")] = 200000
    cooldown_s: Annotated[
        float, msgspec.Meta(ge=0, description="a job or GPU gets at most one incident per this period")
    ] = 300.0
    evidence: Annotated[
        bool,
        msgspec.Meta(
            description="ask the incident's hosts for their ranks' Python stacks, the kernel log around the "
            "fault and an nvidia-smi-shaped GPU snapshot, and hold any drain of those hosts until it is "
            "attached or evidence_timeout_s passed"
        ),
    ] = True
    evidence_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=120, description="how long each host may take over its evidence (drains wait)"),
    ] = 20.0
    evidence_window_s: Annotated[
        float, msgspec.Meta(ge=0, le=600, description="kernel log kept on either side of the fault time")
    ] = 120.0
    evidence_max_hosts: Annotated[
        int, msgspec.Meta(ge=1, le=256, description="hosts asked for evidence per incident at most")
    ] = 16


class StateConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Durable state: verdicts and latched hardware facts in SQLite (WAL) under ``server.state_dir``."""

    enabled: Annotated[
        bool,
        msgspec.Meta(
            description="keep open and recent closed verdicts, latched per-GPU hardware facts and the Xid "
            "policy's history in state.sqlite3, so a restart neither forgets a fault nor reopens one"
        ),
    ] = True
    flush_interval_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=1.0,
            description="detector-loop write-behind period (batches are acked only once committed, by "
            "their own group commit): a kill -9 loses at most this interval of what ticks changed, never an "
            "acked fact; at most 1 s, the agents' sampling tick",
        ),
    ] = 0.5


class RemediationRule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One line of the policy: verdicts matching every field (shell globs) get ``do``; the first match wins."""

    kind: Annotated[str, msgspec.Meta(description="verdict kind glob (faulty, degraded, stuck, ...)")] = "*"
    action: Annotated[
        str, msgspec.Meta(description="verdict action glob (drain, reset_gpu, reboot, rma, ...)")
    ] = "*"
    reason: Annotated[
        str, msgspec.Meta(description="verdict reason glob (xid_79, not_entered_collective, ...)")
    ] = "*"
    do: Annotated[
        Literal["drain", "none"], msgspec.Meta(description="drain the verdict's node, or leave it alone")
    ] = "drain"


def _default_rules() -> list[RemediationRule]:
    # hardware that needs a reset, reboot or replacement takes no new jobs; a job-level action does not drain
    return [
        RemediationRule(kind="faulty", action="restart_app", do="none"),
        RemediationRule(kind="faulty", action="none", do="none"),
        RemediationRule(kind="faulty"),
        RemediationRule(kind="degraded", action="drain"),
        RemediationRule(kind="degraded", action="rma"),
        RemediationRule(do="none"),
    ]


class BreakerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The circuit breaker: one bad rule must not drain half the fleet. Counted from Slurm's own state."""

    window_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=30 * 86400,
            description="sentinel's drains within this window count (by Slurm's reason time)",
        ),
    ] = 3600.0
    max_drains: Annotated[
        int,
        msgspec.Meta(ge=0, description="refuse a drain that would make more sentinel drains in the window"),
    ] = 5
    max_fraction: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=1,
            description="...or more than this fraction of the partition's nodes drained by sentinel",
        ),
    ] = 0.1
    max_unavailable_fraction: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=1,
            description="refuse a drain that would leave more than this fraction of the partition down or drained "
            "for any reason",
        ),
    ] = 0.2


class ResumeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Opt-in return to service, only for nodes sentinel drained, after the verdict closed and a check passed."""

    enabled: Annotated[bool, msgspec.Meta(description="resume nodes at all")] = False
    validation_command: Annotated[
        list[str],
        msgspec.Meta(
            description="argv run before a resume, {node} replaced by the node name (e.g. ssh {node} dcgmi "
            "diag -r 2); exit 0 passes; empty: never resume"
        ),
    ] = []
    validation_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, le=86400, description="deadline of the check")
    ] = 900.0
    detectors: Annotated[
        list[str],
        msgspec.Meta(
            description="verdicts of these detectors may resume their node (hardware: closed by a GPU reset or a "
            "new boot clearing the evidence)"
        ),
    ] = msgspec.field(default_factory=lambda: ["hardware"])
    close_reasons: Annotated[
        list[str], msgspec.Meta(description="close reasons that count as real evidence of repair")
    ] = msgspec.field(default_factory=lambda: ["evidence gone"])
    hold_down_drains: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=64,
            description="a node drained this many times for the same GPU and reason within hold_down_window_s "
            "is held down: never resumed automatically again (0: no hold-down)",
        ),
    ] = 3
    hold_down_window_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=30 * 86400, description="the window hold_down_drains are counted in"),
    ] = 86400.0


class RequeueConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Requeue the job a drained node was running, with that node excluded (docs/remediation.md)."""

    enabled: Annotated[
        bool,
        msgspec.Meta(
            description="after a drain for a verdict that names a running Slurm batch job, requeue the job "
            "with the node added to its excluded nodes (once per verdict)"
        ),
    ] = False
    window_s: Annotated[
        float,
        msgspec.Meta(
            gt=0, le=30 * 86400, description="the requeue breaker counts sentinel's requeues this long"
        ),
    ] = 3600.0
    max_requeues: Annotated[
        int,
        msgspec.Meta(
            ge=0, description="refuse a requeue that would make more sentinel requeues in the window"
        ),
    ] = 5


class RemediationConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Acting on verdicts through Slurm: drain the node a verdict names (docs/remediation.md)."""

    enabled: Annotated[bool, msgspec.Meta(description="act on verdicts at all (off by default)")] = False
    dry_run: Annotated[
        bool, msgspec.Meta(description="log and count what would be done, touch nothing (the first step)")
    ] = True
    partition: Annotated[
        str, msgspec.Meta(description="Slurm partition whose nodes the breaker counts (empty: every node)")
    ] = ""
    node_name: Annotated[
        str, msgspec.Meta(description="Slurm node name of a sentinel host; {host} is the host name")
    ] = "{host}"
    scontrol: Annotated[str, msgspec.Meta(description="scontrol command (path or name)")] = "scontrol"
    sinfo: Annotated[str, msgspec.Meta(description="sinfo command (path or name)")] = "sinfo"
    command_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, le=300, description="deadline of one scontrol/sinfo call")
    ] = 15.0
    retry_s: Annotated[
        float,
        msgspec.Meta(
            ge=0, le=86400, description="a refused or failed drain of an open verdict is retried this often"
        ),
    ] = 60.0
    audit_log: Annotated[
        str,
        msgspec.Meta(
            description="JSON-lines audit log of every action and refusal (empty: state_dir/remediation.jsonl)"
        ),
    ] = ""
    audit_max_bytes: Annotated[
        int, msgspec.Meta(ge=4096, description="the audit log is rotated to .1 past this size")
    ] = 64 * 1024 * 1024
    lease_file: Annotated[
        str,
        msgspec.Meta(
            description="with two aggregators: a file on storage both mount (lockf must work on it, as for "
            "Slurm's StateSaveLocation); only the lease holder acts, the other takes over when it lapses; "
            "empty: this aggregator acts alone"
        ),
    ] = ""
    lease_s: Annotated[
        float,
        msgspec.Meta(ge=1, le=3600, description="the lease runs this long and is renewed every third of it"),
    ] = 15.0
    lease_holder: Annotated[
        str,
        msgspec.Meta(
            max_length=256, description="this aggregator's name in the lease (empty: host name and state_dir)"
        ),
    ] = ""
    rules: Annotated[list[RemediationRule], msgspec.Meta(description="the policy, first match wins")] = (
        msgspec.field(default_factory=_default_rules)
    )
    learned_quorum: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=100000,
            description="a verdict that compares its host with what was learned from the fleet (a driver/VBIOS "
            "or inventory majority, a clock or compute median) is acted on only when at least this many "
            "distinct hosts other than its own hold that yardstick; configured expectations and a host's own "
            "evidence need none. Below it the verdict stays open, is not pushed to the host's health check, "
            "and its drain is refused as learned_without_quorum",
        ),
    ] = 3
    drain_domains: Annotated[
        bool,
        msgspec.Meta(
            description="a verdict about a whole NVLink domain (fabric_domain_down, which needs reports from "
            "detect.fabric_domain.min_hosts of its hosts) drains every host of the domain, each once and each "
            "through the breaker, when the rules drain it; off: such a verdict drains nothing (each host's "
            "own verdicts still do)"
        ),
    ] = False
    breaker: BreakerConfig = msgspec.field(default_factory=BreakerConfig)
    resume: ResumeConfig = msgspec.field(default_factory=ResumeConfig)
    requeue: RequeueConfig = msgspec.field(default_factory=RequeueConfig)


class AggregatorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything ``sentinel aggregator`` reads from its TOML file."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    fleet: FleetConfig = msgspec.field(default_factory=FleetConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    detect: DetectConfig = msgspec.field(default_factory=DetectConfig)
    incidents: IncidentsConfig = msgspec.field(default_factory=IncidentsConfig)
    state: StateConfig = msgspec.field(default_factory=StateConfig)
    remediation: RemediationConfig = msgspec.field(default_factory=RemediationConfig)

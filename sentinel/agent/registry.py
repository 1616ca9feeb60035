"""The agent's collector registry: every collector the agent can run, each built from the configuration.

node_exporter's model: a collector has a name, is built (or left out) from the config by its entry here,
and reports its own ``sentinel_agent_collector_{duration_seconds,success}``. The agent runs whatever the
registry builds; nothing else decides which collectors exist. A simulated host changes none of this: its
:class:`~sentinel.agent.source.HostInputs` replace the OS boundaries under the same collectors (kernel log
records, job log lines, the process table, probe datagrams, IB ports).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from prometheus_client.registry import Collector as MetricFamilies

from sentinel.agent.collectors.base import Collector
from sentinel.agent.collectors.flight_recorder import FrDumpCollector, ProbeCollector
from sentinel.agent.collectors.gpu import GpuCollector
from sentinel.agent.collectors.jobs import JobsCollector
from sentinel.agent.collectors.lines import KmsgCollector, LineProcessor, LogCollector
from sentinel.agent.collectors.xid import XidCollector, XidListener
from sentinel.agent.frdump import FrDumpWatcher
from sentinel.agent.jobs import JobMapper, run_listpids
from sentinel.agent.journal import kernel_reader
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.probe import HeadsAuthorizer, ProbeServer
from sentinel.agent.sink import CollectorSink
from sentinel.agent.source import GpuSource, HostInputs
from sentinel.agent.tailer import LogTailer
from sentinel.components import registry as signals
from sentinel.components.fabric.collector import FabricManagerCollector, FabricManagerMetrics
from sentinel.components.fabric.manager import Systemctl, UnitReader
from sentinel.components.ib.collector import IbCollector, IbPortReader
from sentinel.components.ib.metrics import IbPortMetrics
from sentinel.components.ib.sysfs import PortSource, SysfsPorts
from sentinel.components.ib.tracker import PortTracker
from sentinel.components.nccl_ras.collector import RasCollector
from sentinel.components.nccl_ras.metrics import RasMetrics
from sentinel.components.netdev.collector import NetdevCollector
from sentinel.components.netdev.metrics import NetdevMetrics
from sentinel.components.netdev.qdisc import NetlinkQdiscs
from sentinel.components.netdev.sysfs import SysfsNetdevs
from sentinel.components.xid.merge import XidMerger
from sentinel.config.agent import AgentConfig
from sentinel.log import get_logger

log = get_logger(module="agent.registry")


@dataclass(frozen=True)
class BuildContext:
    """What the collectors are built from: the configuration, the host's boundaries, and where they write."""

    config: AgentConfig
    host: str
    cluster: str
    source: GpuSource
    inputs: HostInputs
    sink: CollectorSink
    counters: AgentCounters
    lines: LineProcessor
    xids: XidMerger
    inline: bool = False
    #: state that outlives a restart is kept (an existing state dir)
    durable: bool = False
    expected_gpus_path: Path | None = None
    kmsg_cursor_path: Path | None = None


@dataclass(frozen=True)
class CollectorEntry:
    name: str
    #: the collector for this agent (given the ones built before it), or ``None`` when its configuration
    #: leaves it out
    build: Callable[[BuildContext, Sequence[Collector]], Collector | None]


def _nvml(ctx: BuildContext, _: Sequence[Collector]) -> Collector:
    c = ctx.config.collect
    return GpuCollector(
        ctx.sink,
        ctx.source,
        tick_s=c.tick_s,
        slow_tick_s=c.slow_tick_s,
        timeout_s=c.nvml_timeout_s,
        expected_gpus=c.expected_gpus,
        expected_path=ctx.expected_gpus_path,
    )


def _xid(ctx: BuildContext, built: Sequence[Collector]) -> Collector | None:
    gpu = next((c for c in built if isinstance(c, GpuCollector)), None)
    if not ctx.config.collect.nvml_events or gpu is None:
        return None  # Xid events come from the event set of the NVML collector's open GPUs
    listener = XidListener(ctx.source, f"{ctx.host}-xid", inline=ctx.inline)
    gpu.on_open = listener.start
    return XidCollector(ctx.sink, listener, ctx.xids, ctx.config.collect.tick_s)


def _ib(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    """IB/RoCE ports: from sysfs, or from a simulated host that offers a port source (``ib_ports``)."""
    c = ctx.config.ib
    if not c.enabled:
        return None
    sim_source = ctx.inputs.ib_ports
    source: PortSource = sim_source if sim_source is not None else SysfsPorts(c.sysfs_root)
    state_dir = Path(ctx.config.agent.state_dir)
    tracker = PortTracker(
        flap_window_s=c.flap_window_s,
        error_window_s=c.error_window_s,
        state_path=state_dir / "ib_ports.json" if ctx.durable and sim_source is None else None,
    )
    metrics = IbPortMetrics(ctx.cluster, ctx.host)
    return IbCollector(ctx.sink, IbPortReader(source, tracker, metrics), c.interval_s)


def _kmsg(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    c = ctx.config
    if ctx.inputs.kernel_log is not None:
        return KmsgCollector(ctx.inputs.kernel_log, ctx.lines, c.collect.tick_s)
    if not c.kmsg.enabled:
        return None
    cursor = ctx.kmsg_cursor_path
    reader = kernel_reader(
        c.kmsg.path,
        c.kmsg.max_records_per_tick,
        cursor_path=cursor,
        journal_cursor_path=cursor.with_name("journal.cursor") if cursor is not None else None,
    )
    return KmsgCollector(reader, ctx.lines, c.collect.tick_s)


def _netdev(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    """Network interfaces from sysfs (a simulated host has none: its job traffic is on its IB ports)."""
    c = ctx.config.netdev
    if not c.enabled or ctx.inputs.ib_ports is not None:
        return None
    metrics = NetdevMetrics(ctx.cluster, ctx.host)
    qdiscs = NetlinkQdiscs(netns=c.netns) if c.qdiscs else None
    return NetdevCollector(ctx.sink, SysfsNetdevs(c.sysfs_root, qdiscs), metrics, c.interval_s)


def _fabric_manager(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    """The fabric manager's service: through systemd, or a simulated host's answer (``fabric_manager``)."""
    c = ctx.config.fabric_manager
    if not c.enabled or (ctx.inputs.simulated and ctx.inputs.fabric_manager is None):
        return None
    reader: UnitReader = ctx.inputs.fabric_manager or Systemctl()
    metrics = FabricManagerMetrics(ctx.cluster, ctx.host)
    return FabricManagerCollector(ctx.sink, reader, metrics, c.interval_s)


def _logs(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    c = ctx.config
    if ctx.inputs.job_logs is not None:
        return LogCollector(ctx.inputs.job_logs, ctx.lines, ctx.counters, c.collect.tick_s)
    if not c.logs.globs:
        return None
    tailer = LogTailer(
        c.logs.globs,
        rescan_s=c.logs.rescan_s,
        max_line_bytes=c.logs.max_line_bytes,
        max_bytes_per_poll=c.logs.max_bytes_per_tick,
        max_files=c.logs.max_files,
    )
    return LogCollector(tailer, ctx.lines, ctx.counters, c.collect.tick_s)


def _jobs(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    c = ctx.config
    table = ctx.inputs.processes
    mapper = (
        JobMapper(tailed_globs=c.logs.globs, listpids=lambda: run_listpids(ctx.host))
        if table is None
        else JobMapper(tailed_globs=c.logs.globs, listpids=None, processes=table)  # no Slurm under a sim
    )
    return JobsCollector(ctx.sink, mapper, c.collect.procs_interval_s)


def _nccl_ras(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    c = ctx.config
    if not c.nccl_ras.enabled:
        return None
    r = c.nccl_ras
    return RasCollector(
        ctx.sink,
        RasMetrics(ctx.cluster, ctx.host),
        host=r.host,
        port=r.port,
        interval_s=r.interval_s,
        timeout_s=r.timeout_s,
        refused_backoff_s=r.refused_backoff_s,
        tick_s=c.collect.tick_s,
    )


def _probe(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    c = ctx.config
    feed = ctx.inputs.probe
    if feed is None and not c.probe.socket_path:
        return None
    table = ctx.inputs.processes  # senders are checked against the table the job mapper reads
    authorizer = (
        HeadsAuthorizer(ctx.sink.procs)
        if table is None
        else HeadsAuthorizer(ctx.sink.procs, owner_uid=table.owner_uid)
    )
    server = ProbeServer(
        c.probe.socket_path if feed is None else "",
        max_bytes=c.probe.max_datagram_bytes,
        max_pending=c.probe.max_pending,
        max_pending_bytes=c.probe.max_pending_bytes,
        mode=c.probe.socket_mode,
        group=c.probe.socket_group,
        authorizer=authorizer,
    )
    return ProbeCollector(ctx.sink, server, c.collect.tick_s, feed)  # no feed: the agent binds its socket


def _fr_dumps(ctx: BuildContext, _: Sequence[Collector]) -> Collector | None:
    c = ctx.config
    if not c.probe.fr_dump_dir:
        return None
    watcher = FrDumpWatcher(c.probe.fr_dump_dir, c.probe.fr_dump_prefix)
    return FrDumpCollector(ctx.sink, watcher, max(c.collect.tick_s, 2.0))


#: how each collector of the registry (:data:`sentinel.components.registry.COLLECTORS`) is built
BUILDERS: Final[dict[str, Callable[[BuildContext, Sequence[Collector]], Collector | None]]] = {
    "nvml": _nvml,
    "xid": _xid,
    "ib": _ib,
    "netdev": _netdev,
    "fabric_manager": _fabric_manager,
    "kmsg": _kmsg,
    "logs": _logs,
    "jobs": _jobs,
    "nccl_ras": _nccl_ras,
    "probe": _probe,
    "fr_dumps": _fr_dumps,
}

#: every collector, in the registry's order (a name without a builder fails at import, not at run time)
COLLECTORS: Final[tuple[CollectorEntry, ...]] = tuple(
    CollectorEntry(name, BUILDERS[name]) for name in signals.COLLECTORS
)


def build_collectors(ctx: BuildContext) -> list[Collector]:
    """Every collector the configuration enables, in registry order (``nvml`` first: it opens the GPUs).

    ``collect.disabled`` leaves a collector out before it is built: nothing of it runs, opens files or
    registers metrics.
    """
    built: list[Collector] = []
    off = set(ctx.config.collect.disabled)
    for entry in COLLECTORS:
        if entry.name in off:
            log.info("collector_disabled", collector=entry.name, host=ctx.host)
            continue
        collector = entry.build(ctx, built)
        if collector is not None:
            built.append(collector)
    return built


@dataclass
class Assembly:
    """The parts of the built collectors the agent holds on to."""

    gpu: GpuCollector | None = None
    #: the ib collector's port history (kernel lines about a port are evidence for it)
    port_tracker: PortTracker | None = None
    #: the probe socket the agent binds on start (None: no socket, or a simulated host's feed)
    probe: ProbeServer | None = None
    #: the metric families the built collectors export, for the agent's registry
    families: list[MetricFamilies] = field(default_factory=list)


def assemble(collectors: Sequence[Collector]) -> Assembly:
    """What of ``collectors`` the agent wires up beyond running them."""
    out = Assembly()
    for collector in collectors:
        if isinstance(collector, GpuCollector):
            out.gpu = collector
        elif isinstance(collector, IbCollector):
            out.port_tracker = collector.reader.tracker
            out.families.append(collector.reader.metrics)
        elif isinstance(collector, RasCollector | NetdevCollector | FabricManagerCollector):
            out.families.append(collector.metrics)
        elif isinstance(collector, ProbeCollector) and collector.feed is None:
            out.probe = collector.server
    return out

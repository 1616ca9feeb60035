"""The agent's collector registry: every collector the agent can run, each built from the configuration.

node_exporter's model: a collector has a name, is built (or left out) from the config by its entry here,
and reports its own ``sentinel_agent_collector_{duration_seconds,success}``. The agent runs whatever the
registry builds; nothing else decides which collectors exist. A simulated host changes none of this: its
:class:`~sentinel.agent.source.HostInputs` replace the OS boundaries under the same collectors (kernel log
records, job log lines, the process table, probe datagrams, IB ports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sentinel.agent.collectors import (
    Collector,
    FrDumpCollector,
    GpuCollector,
    JobsCollector,
    KmsgCollector,
    LogCollector,
    ProbeCollector,
    XidCollector,
    XidListener,
)
from sentinel.agent.frdump import FrDumpWatcher
from sentinel.agent.jobs import JobMapper, run_listpids
from sentinel.agent.journal import kernel_reader
from sentinel.agent.probe import HeadsAuthorizer, ProbeServer
from sentinel.agent.tailer import LogTailer
from sentinel.components import registry as signals
from sentinel.components.ib.collector import IbCollector, IbPortReader, PortSource
from sentinel.components.ib.metrics import IbPortMetrics
from sentinel.components.ib.sysfs import SysfsPorts
from sentinel.components.ib.tracker import PortTracker
from sentinel.components.nccl_ras.collector import RasCollector
from sentinel.components.nccl_ras.metrics import RasMetrics
from sentinel.log import get_logger

if TYPE_CHECKING:
    from sentinel.agent.agent import Agent


log = get_logger(module="agent.registry")


@dataclass(frozen=True)
class CollectorEntry:
    name: str
    #: the collector for this agent, or ``None`` when its configuration leaves it out
    build: Callable[[Agent], Collector | None]


def _nvml(agent: Agent) -> Collector:
    c = agent.config.collect
    collector = GpuCollector(
        agent,
        agent.source,
        tick_s=c.tick_s,
        slow_tick_s=c.slow_tick_s,
        timeout_s=c.nvml_timeout_s,
        expected_gpus=c.expected_gpus,
        expected_path=agent.expected_gpus_path,
    )
    agent.gpu_collector = collector
    return collector


def _xid(agent: Agent) -> Collector | None:
    if not agent.config.collect.nvml_events or agent.gpu_collector is None:
        return None  # Xid events come from the event set of the NVML collector's open GPUs
    listener = XidListener(agent.source, f"{agent.host}-xid", inline=agent.inline)
    agent.gpu_collector.on_open = listener.start
    return XidCollector(agent, listener, agent.xids, agent.config.collect.tick_s)


def _ib(agent: Agent) -> Collector | None:
    """IB/RoCE ports: from sysfs, or from a simulated host that offers a port source (``ib_ports``)."""
    c = agent.config.ib
    if not c.enabled:
        return None
    sim_source = agent.inputs.ib_ports
    source: PortSource = sim_source if sim_source is not None else SysfsPorts(c.sysfs_root)
    state_dir = Path(agent.config.agent.state_dir)
    tracker = PortTracker(
        flap_window_s=c.flap_window_s,
        error_window_s=c.error_window_s,
        state_path=state_dir / "ib_ports.json" if agent.durable and sim_source is None else None,
    )
    agent.ib_tracker = tracker
    agent.ib_metrics = IbPortMetrics(agent.cluster, agent.host)
    agent.registry.register(agent.ib_metrics)
    return IbCollector(agent, IbPortReader(source, tracker, agent.ib_metrics), c.interval_s)


def _kmsg(agent: Agent) -> Collector | None:
    c = agent.config
    if agent.inputs.kernel_log is not None:
        return KmsgCollector(agent.inputs.kernel_log, agent.lines, c.collect.tick_s)
    if not c.kmsg.enabled:
        return None
    cursor = agent.kmsg_cursor_path
    reader = kernel_reader(
        c.kmsg.path,
        c.kmsg.max_records_per_tick,
        cursor_path=cursor,
        journal_cursor_path=cursor.with_name("journal.cursor") if cursor is not None else None,
    )
    return KmsgCollector(reader, agent.lines, c.collect.tick_s)


def _logs(agent: Agent) -> Collector | None:
    c = agent.config
    if agent.inputs.job_logs is not None:
        return LogCollector(agent.inputs.job_logs, agent.lines, agent.counters, c.collect.tick_s)
    if not c.logs.globs:
        return None
    tailer = LogTailer(
        c.logs.globs,
        rescan_s=c.logs.rescan_s,
        max_line_bytes=c.logs.max_line_bytes,
        max_bytes_per_poll=c.logs.max_bytes_per_tick,
        max_files=c.logs.max_files,
    )
    return LogCollector(tailer, agent.lines, agent.counters, c.collect.tick_s)


def _jobs(agent: Agent) -> Collector | None:
    c = agent.config
    table = agent.inputs.processes
    mapper = (
        JobMapper(tailed_globs=c.logs.globs, listpids=lambda: run_listpids(agent.host))
        if table is None
        else JobMapper(tailed_globs=c.logs.globs, listpids=None, processes=table)  # no Slurm under a sim
    )
    return JobsCollector(agent, mapper, c.collect.procs_interval_s)


def _nccl_ras(agent: Agent) -> Collector | None:
    c = agent.config
    if not c.nccl_ras.enabled:
        return None
    agent.ras_metrics = RasMetrics(agent.cluster, agent.host)
    agent.registry.register(agent.ras_metrics)
    r = c.nccl_ras
    return RasCollector(
        agent,
        agent.ras_metrics,
        host=r.host,
        port=r.port,
        interval_s=r.interval_s,
        timeout_s=r.timeout_s,
        refused_backoff_s=r.refused_backoff_s,
        tick_s=c.collect.tick_s,
    )


def _probe(agent: Agent) -> Collector | None:
    c = agent.config
    feed = agent.inputs.probe
    if feed is None and not c.probe.socket_path:
        return None
    table = agent.inputs.processes  # senders are checked against the table the job mapper reads
    authorizer = (
        HeadsAuthorizer(agent.procs)
        if table is None
        else HeadsAuthorizer(agent.procs, owner_uid=table.owner_uid)
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
    if feed is None:
        agent.probe = server  # the agent binds its socket on start
    return ProbeCollector(agent, server, c.collect.tick_s, feed)


def _fr_dumps(agent: Agent) -> Collector | None:
    c = agent.config
    if not c.probe.fr_dump_dir:
        return None
    watcher = FrDumpWatcher(c.probe.fr_dump_dir, c.probe.fr_dump_prefix)
    return FrDumpCollector(agent, watcher, max(c.collect.tick_s, 2.0))


#: how each collector of the registry (:data:`sentinel.components.registry.COLLECTORS`) is built
BUILDERS: Final[dict[str, Callable[[Agent], Collector | None]]] = {
    "nvml": _nvml,
    "xid": _xid,
    "ib": _ib,
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


def build_collectors(agent: Agent) -> list[Collector]:
    """Every collector the configuration enables, in registry order (``nvml`` first: it opens the GPUs).

    ``collect.disabled`` leaves a collector out before it is built: nothing of it runs, opens files or
    registers metrics.
    """
    built: list[Collector] = []
    off = set(agent.config.collect.disabled)
    for entry in COLLECTORS:
        if entry.name in off:
            log.info("collector_disabled", collector=entry.name, host=agent.host)
            continue
        collector = entry.build(agent)
        if collector is not None:
            built.append(collector)
    return built

"""The agent's ``/metrics``: GPU series from the latest samples, and the agent's own health.

A collector on sentinel's own metric families (:mod:`sentinel.components.families`) renders everything at
scrape time from the agent's current state, instead of keeping thousands of labelled gauge children up to
date every tick: the tick stays cheap, and a GPU whose job/rank changes (a new job starts) simply gets
series with the new labels, with no stale children to remove. Each agent has its own
:class:`CollectorRegistry`, so many agents can live in one process (``sentinel demo``). Names and labels
are listed in docs/metrics.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from sentinel.components.exposition import (
    GpuRow,
    KeptFamilies,
    MetricsView,
    Writer,
    escape,
    write_families,
)
from sentinel.components.families import (
    Collector,
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from sentinel.components.registry import GPU_SIGNALS
from sentinel.wire import GpuInfo, GpuSample, GpuState

GPU_LABELS = ["cluster", "host", "gpu", "uuid", "pci_bus", "job", "rank"]


@dataclass
class AgentCounters:
    """Monotonic counts and current gauges of the agent itself; updated by the agent, read at scrape."""

    #: (gpu, xid, catalog severity) → occurrences
    xid: dict[tuple[int, int, str], int] = field(default_factory=lambda: defaultdict(int))
    log_events: dict[tuple[str, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )  # (kind, severity)
    nvml_errors: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    dropped: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # totals, by `what`
    #: cumulative drop counts by cause; the agent sums them into ``dropped`` each tick
    drop_parts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    collector_duration: dict[str, float] = field(default_factory=dict)
    collector_success: dict[str, bool] = field(default_factory=dict)
    queue_depth: dict[str, int] = field(default_factory=dict)
    #: connections the aggregator refused for who this agent is (token file, token, host), by reason
    stream_refused: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: evidence stacks not read, by reason (not_a_local_rank, gone, read_failed, deadline)
    evidence_problems: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    spool_bytes: int = 0
    #: spool and ack-log writes that failed (disk full, read-only state_dir): what is not on disk may be lost
    spool_write_errors: int = 0
    connected: bool = False  # to at least one aggregator (the host's data reaches someone)
    #: per aggregator URL: its stream is up (several with ``stream.aggregator_urls``)
    aggregators: dict[str, bool] = field(default_factory=dict)
    batches_sent: int = 0
    batches_acked: int = 0
    last_tick: float = 0.0
    ticks: int = 0


class GpuView:
    """What the metrics need to know about one GPU: identity, latest samples, job/rank."""

    def __init__(self, info: GpuInfo) -> None:
        self.info = info
        self.state: GpuState = "ok"
        self.fast: GpuSample | None = None
        self.slow: GpuSample | None = None  # the latest sample that carried the slow counters
        self.job = ""
        self.rank = ""
        self._labels: tuple[tuple[str, str], str] | None = None

    def label_string(self, cluster: str, host: str, index: int) -> str:
        """The escaped GPU label set, rebuilt only when job/rank change."""
        key = (self.job, self.rank)
        if self._labels is None or self._labels[0] != key:
            g = self.info
            text = (
                f'cluster="{escape(cluster)}",host="{escape(host)}",gpu="{index}",uuid="{escape(g.uuid)}",'
                f'pci_bus="{escape(g.pci_bus)}",job="{escape(self.job)}",rank="{escape(self.rank)}"'
            )
            self._labels = (key, text)
        return self._labels[1]


class AgentMetricsCollector(Collector):
    """Renders an agent's state: GPU series as text (fast path), agent health as metric families."""

    def __init__(self, cluster: str, host: str, gpus: dict[int, GpuView], counters: AgentCounters) -> None:
        self.cluster = cluster
        self.host = host
        self.gpus = gpus
        self.counters = counters
        #: the registry's families as written at the last scrape (a family with equal samples is not rewritten)
        self._family_texts: KeptFamilies = {}
        #: signal name → (what its text was written from, the slow samples held, the text): see _gpu_parts
        self._slow_texts: dict[
            str, tuple[tuple[tuple[str, str, bool, int], ...], list[GpuSample | None], bytes]
        ] = {}

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the GPUs present

    def collect(self) -> Iterator[Metric]:
        """The agent's own health (few series); the GPU series are written by :meth:`render`."""
        yield from self._agent_families()

    def render(self, registry: CollectorRegistry) -> bytes:
        """The whole /metrics body: the per-GPU series, then the registry's (agent health).

        The body is joined once from its parts' bytes (the kept texts are kept encoded): most of it is the
        slow-only GPU families' kept text, copied here and nowhere else."""
        parts = self._gpu_parts()
        out = Writer()
        write_families(out, registry.collect(), self._family_texts)
        parts.append(out.text().encode())
        return b"".join(parts)

    def render_gpu_text(self) -> str:
        """The per-GPU series: every GPU signal's families (:mod:`sentinel.components.registry`), in registry
        order; a signal that read only the slow samples keeps its text while they, the GPUs' labels and
        states are the same."""
        return b"".join(self._gpu_parts()).decode()

    def _gpu_parts(self) -> list[bytes]:
        """:meth:`render_gpu_text`'s text, as each signal's encoded part."""
        xids: dict[int, dict[tuple[int, str], int]] = defaultdict(dict)
        for (gpu_index, code, severity), count in self.counters.xid.items():
            xids[gpu_index][(code, severity)] = count
        rows = [
            GpuRow(
                index=index,
                labels=view.label_string(self.cluster, self.host, index),
                info=view.info,
                state=view.state,
                fast=view.fast,
                slow=view.slow,
                xids=xids.get(index, {}),
            )
            for index, view in sorted(self.gpus.items())
        ]
        # what a slow-only render reads (the slow samples by identity: the cache holds them, so ids stay theirs)
        slow_key = tuple((r.labels, r.state, r.fast is not None, id(r.slow)) for r in rows)
        slow = [r.slow for r in rows]
        parts: list[bytes] = []
        for signal in GPU_SIGNALS:
            if signal.render is None:
                continue
            kept = self._slow_texts.get(signal.name)
            if kept is not None and kept[0] == slow_key:
                parts.append(kept[2])
                continue
            fresh = Writer()
            view = MetricsView(rows)
            signal.render(fresh, view)
            text = fresh.text().encode()
            if view.read_beyond_slow:
                self._slow_texts.pop(signal.name, None)
            else:
                self._slow_texts[signal.name] = (slow_key, slow, text)
            parts.append(text)
        return parts

    def _agent_families(self) -> Iterator[Metric]:
        c = self.counters
        base = [self.cluster, self.host]
        names = ["cluster", "host"]
        logs = CounterMetricFamily(
            "sentinel_log_events",
            "classified NCCL/PyTorch/kernel log events",
            labels=[*names, "kind", "severity"],
        )
        for (kind, severity), count in sorted(c.log_events.items()):
            logs.add_metric([*base, kind, severity], float(count))
        yield logs
        duration = GaugeMetricFamily(
            "sentinel_agent_collector_duration_seconds",
            "duration of the collector's last run",
            labels=[*names, "collector"],
        )
        success = GaugeMetricFamily(
            "sentinel_agent_collector_success",
            "1 when the collector's last run succeeded",
            labels=[*names, "collector"],
        )
        for name, seconds in sorted(c.collector_duration.items()):
            duration.add_metric([*base, name], seconds)
            success.add_metric([*base, name], 1.0 if c.collector_success.get(name) else 0.0)
        yield duration
        yield success
        errors = CounterMetricFamily(
            "sentinel_agent_nvml_errors",
            "NVML calls that failed, by function and error",
            labels=[*names, "function", "error"],
        )
        for (function, error), count in sorted(c.nvml_errors.items()):
            errors.add_metric([*base, function, error], float(count))
        yield errors
        dropped = CounterMetricFamily(
            "sentinel_agent_dropped", "things the agent had to drop", labels=[*names, "what"]
        )
        for what in ("samples", "events", "log_lines", "probe"):
            dropped.add_metric([*base, what], float(c.dropped.get(what, 0)))
        yield dropped
        depth = GaugeMetricFamily(
            "sentinel_agent_queue_depth", "items waiting in the agent's queues", labels=[*names, "queue"]
        )
        for queue, value in sorted(c.queue_depth.items()):
            depth.add_metric([*base, queue], float(value))
        yield depth
        spool = GaugeMetricFamily(
            "sentinel_agent_spool_bytes", "bytes of unacked batches in the on-disk spool", labels=names
        )
        spool.add_metric(base, float(c.spool_bytes))
        yield spool
        spool_errors = CounterMetricFamily(
            "sentinel_agent_spool_write_errors",
            "spool batch and ack-log writes that failed (a batch not on disk is lost by a restart; a lost ack "
            "costs a resend)",
            labels=names,
        )
        spool_errors.add_metric(base, float(c.spool_write_errors))
        yield spool_errors
        connected = GaugeMetricFamily(
            "sentinel_agent_connected", "1 while the WebSocket to the aggregator is up", labels=names
        )
        connected.add_metric(base, 1.0 if c.connected else 0.0)
        yield connected
        per_url = GaugeMetricFamily(
            "sentinel_agent_aggregator_connected",
            "1 while the WebSocket to this aggregator is up (one series per configured URL)",
            labels=[*names, "url"],
        )
        for url, up in sorted(c.aggregators.items()):
            per_url.add_metric([*base, url], 1.0 if up else 0.0)
        yield per_url
        refused = CounterMetricFamily(
            "sentinel_agent_stream_refused",
            "connections to the aggregator refused for the agent's identity (token_file, unauthorized, "
            "host_not_allowed)",
            labels=[*names, "reason"],
        )
        for reason in ("token_file", "unauthorized", "host_not_allowed"):
            refused.add_metric([*base, reason], float(c.stream_refused.get(reason, 0)))
        yield refused
        evidence = CounterMetricFamily(
            "sentinel_agent_evidence_problems",
            "incident evidence stacks not read, by reason: not_a_local_rank (the request named a rank this "
            "host does not run: refused), gone (no longer that rank), read_failed (py-spy failed), deadline",
            labels=[*names, "reason"],
        )
        for reason in ("not_a_local_rank", "gone", "read_failed", "deadline"):
            evidence.add_metric([*base, reason], float(c.evidence_problems.get(reason, 0)))
        yield evidence
        sent = CounterMetricFamily(
            "sentinel_agent_batches_sent", "batches sent (resends included)", labels=names
        )
        sent.add_metric(base, float(c.batches_sent))
        yield sent
        acked = CounterMetricFamily(
            "sentinel_agent_batches_acked", "batches acked by the aggregator", labels=names
        )
        acked.add_metric(base, float(c.batches_acked))
        yield acked
        last = GaugeMetricFamily(
            "sentinel_agent_last_tick_timestamp_seconds",
            "unix time of the agent's last collection tick",
            labels=names,
        )
        last.add_metric(base, c.last_tick)
        yield last


def make_registry(collector: AgentMetricsCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry

"""The agent's ``/metrics``: GPU series from the latest samples, and the agent's own health.

A custom prometheus-client collector renders everything at scrape time from the agent's current state,
instead of keeping thousands of labelled gauge children up to date every tick: the tick stays cheap, and a
GPU whose job/rank changes (a new job starts) simply gets series with the new labels — no stale children to
remember to remove. Each agent has its own :class:`CollectorRegistry`, so many agents can live in one
process (``sentinel demo``). Names and labels follow /work/notes/metrics.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from sentinel.wire import GpuInfo, GpuSample, GpuState

GPU_LABELS = ["cluster", "host", "gpu", "uuid", "pci_bus", "job", "rank"]
GPU_STATES: tuple[GpuState, ...] = ("ok", "lost", "unresponsive")
THROTTLE_NAMES = (
    "gpu_idle",
    "applications_clocks",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clocks",
)
KIB = 1024.0


@dataclass
class AgentCounters:
    """Monotonic counts and current gauges of the agent itself; updated by the agent, read at scrape."""

    xid: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))  # (gpu, xid)
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
    spool_bytes: int = 0
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
                f'cluster="{_escape(cluster)}",host="{_escape(host)}",gpu="{index}",uuid="{_escape(g.uuid)}",'
                f'pci_bus="{_escape(g.pci_bus)}",job="{_escape(self.job)}",rank="{_escape(self.rank)}"'
            )
            self._labels = (key, text)
        return self._labels[1]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if v in (math.inf, -math.inf):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class _Writer:
    """Accumulates exposition lines."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def family(self, name: str, kind: str, doc: str) -> None:
        self._parts.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")

    def line(self, name: str, labels: str, value: float, extra: str = "") -> None:
        if extra:
            self._parts.append(f"{name}{{{labels},{extra}}} {_value(value)}\n")
        else:
            self._parts.append(f"{name}{{{labels}}} {_value(value)}\n")

    def text(self) -> str:
        return "".join(self._parts)


#: (GpuSample attribute, metric, help, multiplier, divisor)
SIMPLE_GAUGES: tuple[tuple[str, str, str, float, float], ...] = (
    ("util_gpu_pct", "sentinel_gpu_utilization_ratio", "GPU (SM) utilization, 0..1", 1.0, 100.0),
    (
        "util_mem_pct",
        "sentinel_gpu_memory_utilization_ratio",
        "memory controller utilization, 0..1",
        1.0,
        100.0,
    ),
    ("mem_used_bytes", "sentinel_gpu_memory_used_bytes", "framebuffer memory in use", 1.0, 1.0),
    ("mem_total_bytes", "sentinel_gpu_memory_total_bytes", "framebuffer memory size", 1.0, 1.0),
    ("temp_c", "sentinel_gpu_temperature_celsius", "GPU core temperature", 1.0, 1.0),
    ("power_w", "sentinel_gpu_power_watts", "power draw", 1.0, 1.0),
    ("power_limit_w", "sentinel_gpu_power_limit_watts", "enforced power limit", 1.0, 1.0),
    ("sm_clock_mhz", "sentinel_gpu_sm_clock_hertz", "current SM clock", 1e6, 1.0),
    ("sm_clock_max_mhz", "sentinel_gpu_sm_clock_max_hertz", "maximum SM clock", 1e6, 1.0),
    ("mem_clock_mhz", "sentinel_gpu_memory_clock_hertz", "current memory clock", 1e6, 1.0),
    ("pstate", "sentinel_gpu_performance_state", "performance state P0..P15 (0 fastest)", 1.0, 1.0),
    ("pcie_tx_kbps", "sentinel_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", KIB, 1.0),
    ("pcie_rx_kbps", "sentinel_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", KIB, 1.0),
)


class AgentMetricsCollector(Collector):
    """Renders an agent's state: GPU series as text (fast path), agent health as metric families."""

    def __init__(self, cluster: str, host: str, gpus: dict[int, GpuView], counters: AgentCounters) -> None:
        self.cluster = cluster
        self.host = host
        self.gpus = gpus
        self.counters = counters

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the GPUs present

    def collect(self) -> Iterator[Metric]:
        """The agent's own health (few series) through prometheus-client; GPU series: render_gpu_text."""
        yield from self._agent_families()

    def render(self, registry: CollectorRegistry) -> bytes:
        """The whole /metrics body: the per-GPU series, then the registry's (agent health)."""
        return self.render_gpu_text().encode() + generate_latest(registry)

    def render_gpu_text(self) -> str:
        """The per-GPU series in the Prometheus text format (0.0.4), written directly.

        prometheus-client's generic path (a Sample tuple and label escaping per series) costs about 12 µs per
        series; with NVLink counters an 8-GPU host has ~1,000 series, which made a 1 s scrape cost more than
        1% of a core. Here each GPU's label set is escaped once and reused, and lines are joined once.
        """
        out = _Writer()
        xid_by_gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for (gpu_index, code), count in self.counters.xid.items():
            xid_by_gpu[gpu_index].append((code, count))
        views = sorted(self.gpus.items())
        labels = {index: view.label_string(self.cluster, self.host, index) for index, view in views}
        ok = [
            (index, view, labels[index])
            for index, view in views
            if view.state == "ok" and view.fast is not None
        ]

        out.family("sentinel_gpu_info", "gauge", "GPU identity; always 1")
        for index, view in views:
            g = view.info
            extra = (
                f'name="{_escape(g.name)}",driver="{_escape(g.driver)}",'
                f'vbios="{_escape(g.vbios)}",serial="{_escape(g.serial)}"'
            )
            out.line("sentinel_gpu_info", labels[index], 1.0, extra)
        out.family("sentinel_gpu_up", "gauge", "1 when the GPU answers NVML, 0 when lost or unresponsive")
        for index, view in views:
            out.line("sentinel_gpu_up", labels[index], 1.0 if view.state == "ok" else 0.0)
        out.family("sentinel_gpu_state", "gauge", "1 for the GPU's current state, 0 for the others")
        for index, view in views:
            for s in GPU_STATES:
                out.line("sentinel_gpu_state", labels[index], 1.0 if view.state == s else 0.0, f'state="{s}"')
        for attr, name, doc, mul, div in SIMPLE_GAUGES:
            out.family(name, "gauge", doc)
            for _, view, lab in ok:
                value = getattr(view.fast, attr)
                if value is not None:
                    out.line(name, lab, float(value) / div if div != 1 else float(value) * mul)
        out.family(
            "sentinel_gpu_throttle_reason", "gauge", "1 while the clock-event (throttle) reason is active"
        )
        for _, view, lab in ok:
            assert view.fast is not None
            active = set(view.fast.throttle)
            for reason in THROTTLE_NAMES:
                out.line(
                    "sentinel_gpu_throttle_reason",
                    lab,
                    1.0 if reason in active else 0.0,
                    f'reason="{reason}"',
                )
        out.family("sentinel_gpu_pcie_replay_total", "counter", "PCIe replay counter")
        for _, view, lab in ok:
            assert view.fast is not None
            if view.fast.pcie_replay is not None:
                out.line("sentinel_gpu_pcie_replay_total", lab, float(view.fast.pcie_replay))
        self._slow_text(out, [(view.slow, lab) for _, view, lab in ok if view.slow is not None])
        out.family("sentinel_gpu_xid_events_total", "counter", "Xid events seen")
        for index, _ in views:
            for code, count in sorted(xid_by_gpu.get(index, [])):
                out.line("sentinel_gpu_xid_events_total", labels[index], float(count), f'xid="{code}"')
        return out.text()

    @staticmethod
    def _slow_text(out: _Writer, slow: list[tuple[GpuSample, str]]) -> None:
        out.family("sentinel_gpu_ecc_errors", "gauge", "ECC error counters (volatile resets at driver load)")
        for sample, lab in slow:
            e = sample.ecc
            if e is None:
                continue
            for value, extra in (
                (e.volatile_corrected, 'type="corrected",scope="volatile"'),
                (e.volatile_uncorrected, 'type="uncorrected",scope="volatile"'),
                (e.aggregate_corrected, 'type="corrected",scope="aggregate"'),
                (e.aggregate_uncorrected, 'type="uncorrected",scope="aggregate"'),
            ):
                if value is not None:
                    out.line("sentinel_gpu_ecc_errors", lab, float(value), extra)
        name = "sentinel_gpu_ecc_uncorrected_location_errors"
        out.family(name, "gauge", "aggregate uncorrected ECC errors by memory location")
        for sample, lab in slow:
            e = sample.ecc
            if e is None:
                continue
            for value, location in ((e.sram_uncorrected, "sram"), (e.dram_uncorrected, "dram")):
                if value is not None:
                    out.line(name, lab, float(value), f'location="{location}"')
        remaps = [(sample.remap, lab) for sample, lab in slow if sample.remap is not None]
        out.family("sentinel_gpu_remapped_rows", "gauge", "rows remapped")
        for r, lab in remaps:
            out.line("sentinel_gpu_remapped_rows", lab, float(r.correctable), 'type="correctable"')
            out.line("sentinel_gpu_remapped_rows", lab, float(r.uncorrectable), 'type="uncorrectable"')
        out.family("sentinel_gpu_row_remap_pending", "gauge", "1 when a row remap waits for a GPU reset")
        for r, lab in remaps:
            out.line("sentinel_gpu_row_remap_pending", lab, 1.0 if r.pending else 0.0)
        out.family("sentinel_gpu_row_remap_failure", "gauge", "1 when row remapping failed (RMA)")
        for r, lab in remaps:
            out.line("sentinel_gpu_row_remap_failure", lab, 1.0 if r.failure else 0.0)
        name = "sentinel_gpu_row_remap_bank_availability"
        out.family(name, "gauge", "row-remapper histogram: banks by spare rows left")
        for r, lab in remaps:
            for level, value in (
                ("max", r.hist_max),
                ("high", r.hist_high),
                ("partial", r.hist_partial),
                ("low", r.hist_low),
                ("none", r.hist_none),
            ):
                if value is not None:
                    out.line(name, lab, float(value), f'level="{level}"')
        retired = [(sample.retired, lab) for sample, lab in slow if sample.retired is not None]
        out.family("sentinel_gpu_retired_pages", "gauge", "retired memory pages")
        for p, lab in retired:
            out.line("sentinel_gpu_retired_pages", lab, float(p.single_bit), 'cause="single_bit"')
            out.line("sentinel_gpu_retired_pages", lab, float(p.double_bit), 'cause="double_bit"')
        out.family(
            "sentinel_gpu_retired_pages_pending", "gauge", "1 when a page retirement waits for a reset"
        )
        for p, lab in retired:
            out.line("sentinel_gpu_retired_pages_pending", lab, 1.0 if p.pending else 0.0)
        links = [(link, lab) for sample, lab in slow for link in sample.nvlink or []]
        out.family("sentinel_gpu_nvlink_up", "gauge", "1 when the NVLink link is active")
        for link, lab in links:
            out.line("sentinel_gpu_nvlink_up", lab, 1.0 if link.active else 0.0, f'link="{link.link}"')
        name = "sentinel_gpu_nvlink_errors_total"
        out.family(name, "counter", "NVLink error counters")
        for link, lab in links:
            out.line(name, lab, float(link.crc_errors), f'link="{link.link}",type="crc"')
            out.line(name, lab, float(link.replay_errors), f'link="{link.link}",type="replay"')
            out.line(name, lab, float(link.recovery_errors), f'link="{link.link}",type="recovery"')

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
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry

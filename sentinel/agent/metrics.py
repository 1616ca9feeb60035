"""The agent's ``/metrics``: GPU series from the latest samples, and the agent's own health.

A custom prometheus-client collector renders everything at scrape time from the agent's current state,
instead of keeping thousands of labelled gauge children up to date every tick: the tick stays cheap, and a
GPU whose job/rank changes (a new job starts) simply gets series with the new labels — no stale children to
remember to remove. Each agent has its own :class:`CollectorRegistry`, so many agents can live in one
process (``sentinel demo``). Names and labels follow /work/notes/metrics.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

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
    dropped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    collector_duration: dict[str, float] = field(default_factory=dict)
    collector_success: dict[str, bool] = field(default_factory=dict)
    queue_depth: dict[str, int] = field(default_factory=dict)
    spool_bytes: int = 0
    connected: bool = False
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


class AgentMetricsCollector(Collector):
    """Renders an agent's state as Prometheus metric families."""

    def __init__(self, cluster: str, host: str, gpus: dict[int, GpuView], counters: AgentCounters) -> None:
        self.cluster = cluster
        self.host = host
        self.gpus = gpus
        self.counters = counters

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the GPUs present

    def collect(self) -> Iterator[Metric]:
        yield from self._gpu_families()
        yield from self._agent_families()

    def _gpu_families(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=GPU_LABELS + (extra or []))

        info = gauge("sentinel_gpu_info", "GPU identity; always 1", ["name", "driver", "vbios", "serial"])
        up = gauge("sentinel_gpu_up", "1 when the GPU answers NVML, 0 when lost or unresponsive")
        state = gauge("sentinel_gpu_state", "1 for the GPU's current state, 0 for the others", ["state"])
        simple: dict[str, tuple[GaugeMetricFamily, str, float]] = {}

        def add_simple(attr: str, name: str, doc: str, scale: float = 1.0) -> None:
            simple[attr] = (gauge(name, doc), attr, scale)

        add_simple("util_gpu_pct", "sentinel_gpu_utilization_ratio", "GPU (SM) utilization, 0..1", -100)
        add_simple(
            "util_mem_pct",
            "sentinel_gpu_memory_utilization_ratio",
            "memory controller utilization, 0..1",
            -100,
        )
        add_simple("mem_used_bytes", "sentinel_gpu_memory_used_bytes", "framebuffer memory in use")
        add_simple("mem_total_bytes", "sentinel_gpu_memory_total_bytes", "framebuffer memory size")
        add_simple("temp_c", "sentinel_gpu_temperature_celsius", "GPU core temperature")
        add_simple("power_w", "sentinel_gpu_power_watts", "power draw")
        add_simple("power_limit_w", "sentinel_gpu_power_limit_watts", "enforced power limit")
        add_simple("sm_clock_mhz", "sentinel_gpu_sm_clock_hertz", "current SM clock", 1e6)
        add_simple("sm_clock_max_mhz", "sentinel_gpu_sm_clock_max_hertz", "maximum SM clock", 1e6)
        add_simple("mem_clock_mhz", "sentinel_gpu_memory_clock_hertz", "current memory clock", 1e6)
        add_simple("pstate", "sentinel_gpu_performance_state", "performance state P0..P15 (0 fastest)")
        add_simple("pcie_tx_kbps", "sentinel_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", KIB)
        add_simple("pcie_rx_kbps", "sentinel_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", KIB)
        throttle = gauge(
            "sentinel_gpu_throttle_reason", "1 while the clock-event (throttle) reason is active", ["reason"]
        )
        replay = CounterMetricFamily("sentinel_gpu_pcie_replay", "PCIe replay counter", labels=GPU_LABELS)
        ecc = gauge(
            "sentinel_gpu_ecc_errors",
            "ECC error counters (volatile resets at driver load)",
            ["type", "scope"],
        )
        ecc_loc = gauge(
            "sentinel_gpu_ecc_uncorrected_location_errors",
            "aggregate uncorrected ECC errors by memory location",
            ["location"],
        )
        remapped = gauge("sentinel_gpu_remapped_rows", "rows remapped", ["type"])
        remap_pending = gauge("sentinel_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset")
        remap_failure = gauge("sentinel_gpu_row_remap_failure", "1 when row remapping failed (RMA)")
        bank = gauge(
            "sentinel_gpu_row_remap_bank_availability",
            "row-remapper histogram: banks by spare rows left",
            ["level"],
        )
        retired = gauge("sentinel_gpu_retired_pages", "retired memory pages", ["cause"])
        retired_pending = gauge(
            "sentinel_gpu_retired_pages_pending", "1 when a page retirement waits for a reset"
        )
        nvlink_up = gauge("sentinel_gpu_nvlink_up", "1 when the NVLink link is active", ["link"])
        nvlink_err = CounterMetricFamily(
            "sentinel_gpu_nvlink_errors", "NVLink error counters", labels=[*GPU_LABELS, "link", "type"]
        )
        xid = CounterMetricFamily("sentinel_gpu_xid_events", "Xid events seen", labels=[*GPU_LABELS, "xid"])
        xid_by_gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for (gpu_index, code), count in self.counters.xid.items():
            xid_by_gpu[gpu_index].append((code, count))

        for index, view in sorted(self.gpus.items()):
            g = view.info
            labels = [self.cluster, self.host, str(index), g.uuid, g.pci_bus, view.job, view.rank]
            info.add_metric([*labels, g.name, g.driver, g.vbios, g.serial], 1.0)
            up.add_metric(labels, 1.0 if view.state == "ok" else 0.0)
            for s in GPU_STATES:
                state.add_metric([*labels, s], 1.0 if view.state == s else 0.0)
            for code, count in sorted(xid_by_gpu.get(index, [])):
                xid.add_metric([*labels, str(code)], float(count))
            sample = view.fast
            if sample is None or view.state != "ok":
                continue
            for family, attr, scale in simple.values():
                value = getattr(sample, attr)
                if value is not None:
                    # a negative scale divides (percent → ratio without 0.41000000000000003)
                    family.add_metric(labels, float(value) / -scale if scale < 0 else float(value) * scale)
            active = set(sample.throttle)
            for reason in THROTTLE_NAMES:
                throttle.add_metric([*labels, reason], 1.0 if reason in active else 0.0)
            if sample.pcie_replay is not None:
                replay.add_metric(labels, float(sample.pcie_replay))
            slow = view.slow
            if slow is None:
                continue
            if slow.ecc is not None:
                e = slow.ecc
                for value, type_, scope in (
                    (e.volatile_corrected, "corrected", "volatile"),
                    (e.volatile_uncorrected, "uncorrected", "volatile"),
                    (e.aggregate_corrected, "corrected", "aggregate"),
                    (e.aggregate_uncorrected, "uncorrected", "aggregate"),
                ):
                    if value is not None:
                        ecc.add_metric([*labels, type_, scope], float(value))
                for value, location in ((e.sram_uncorrected, "sram"), (e.dram_uncorrected, "dram")):
                    if value is not None:
                        ecc_loc.add_metric([*labels, location], float(value))
            if slow.remap is not None:
                r = slow.remap
                remapped.add_metric([*labels, "correctable"], float(r.correctable))
                remapped.add_metric([*labels, "uncorrectable"], float(r.uncorrectable))
                remap_pending.add_metric(labels, 1.0 if r.pending else 0.0)
                remap_failure.add_metric(labels, 1.0 if r.failure else 0.0)
                for level, value in (
                    ("max", r.hist_max),
                    ("high", r.hist_high),
                    ("partial", r.hist_partial),
                    ("low", r.hist_low),
                    ("none", r.hist_none),
                ):
                    if value is not None:
                        bank.add_metric([*labels, level], float(value))
            if slow.retired is not None:
                retired.add_metric([*labels, "single_bit"], float(slow.retired.single_bit))
                retired.add_metric([*labels, "double_bit"], float(slow.retired.double_bit))
                retired_pending.add_metric(labels, 1.0 if slow.retired.pending else 0.0)
            for link in slow.nvlink or []:
                link_labels = [*labels, str(link.link)]
                nvlink_up.add_metric(link_labels, 1.0 if link.active else 0.0)
                nvlink_err.add_metric([*link_labels, "crc"], float(link.crc_errors))
                nvlink_err.add_metric([*link_labels, "replay"], float(link.replay_errors))
                nvlink_err.add_metric([*link_labels, "recovery"], float(link.recovery_errors))
        yield info
        yield up
        yield state
        for family, _, _ in simple.values():
            yield family
        yield from (throttle, replay, ecc, ecc_loc, remapped, remap_pending, remap_failure, bank)
        yield from (retired, retired_pending, nvlink_up, nvlink_err, xid)

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

"""The aggregator's Prometheus metrics (names and labels from the agreed catalog, docs/metrics.md).

Every app instance has its own :class:`~prometheus_client.CollectorRegistry`, so tests can run several
aggregators in one process. Counters and histograms are updated on the ingest path; everything derived from
fleet state (open verdicts, stalled jobs, GPUs by state, last-seen times) is computed at scrape time by a
custom collector, so it costs nothing between scrapes and can never drift from the state it describes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sentinel.aggregator.acks import DurableAcks
from sentinel.aggregator.engine import Engine, EngineMetrics
from sentinel.aggregator.state import HostView
from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.aggregator.verdicts import Change
from sentinel.wire import Batch

LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DETECTION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
GPU_STATES = ("healthy", "degraded", "faulty", "stuck", "straggler", "lost")


def _s(value: object) -> str:
    return "" if value is None else str(value)


class AggregatorMetrics(EngineMetrics):
    def __init__(self, cluster: str, registry: CollectorRegistry | None = None) -> None:
        self.cluster = cluster
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # the per-batch counters are plain numbers (the hot path), exported by the collector at scrape time
        self.n_batches = 0
        self.n_samples = 0
        #: the durable state store, when there is one (its counters are exported at scrape time)
        self.store: StateStore | None = None
        self.state_errors = 0  # failures outside the state store (the incident store could not be opened)
        #: acks held until their batch's state is committed
        self.acks: DurableAcks | None = None
        self.n_events = 0
        self.n_duplicates = 0
        self.lag_counts = [0] * (len(LAG_BUCKETS) + 1)
        self.lag_sum = 0.0
        self._rejected = Counter(
            "sentinel_ingest_rejected",
            "Frames or connections refused, by reason",
            ["cluster", "reason"],
            registry=r,
        )
        self._detection = Histogram(
            "sentinel_detection_latency_seconds",
            "Verdict open time minus the time of its evidence",
            ["cluster", "kind"],
            buckets=DETECTION_BUCKETS,
            registry=r,
        )
        self._opened = Counter(
            "sentinel_verdicts_opened",
            "Verdicts opened, by kind and reason",
            ["cluster", "kind", "reason"],
            registry=r,
        )
        self.incidents = Counter("sentinel_incidents", "Incidents recorded", ["cluster"], registry=r).labels(
            cluster
        )
        self.tick_seconds = Histogram(
            "sentinel_aggregator_tick_duration_seconds",
            "Time one detector tick keeps the event loop busy, summed over its steps (ingest runs between "
            "detectors)",
            ["cluster"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        ).labels(cluster)

        self._detector_seconds = Histogram(
            "sentinel_aggregator_detector_duration_seconds",
            "Time one detector's evaluation takes",
            ["cluster", "detector"],
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self._detector_success = Gauge(
            "sentinel_aggregator_detector_success",
            "1 when the detector's latest evaluation succeeded, 0 when it raised",
            ["cluster", "detector"],
            registry=r,
        )
        self._detector_failures = Counter(
            "sentinel_aggregator_detector_failures",
            "Detector evaluations that raised (the other detectors still ran)",
            ["cluster", "detector"],
            registry=r,
        )
        self.config_reloads = Counter(
            "sentinel_aggregator_config_reloads",
            "Configuration reloads on SIGHUP, by result (applied, refused)",
            ["cluster", "result"],
            registry=r,
        )
        self.config_reload_success = Gauge(
            "sentinel_aggregator_config_last_reload_success",
            "1 when the latest SIGHUP reload was applied, 0 when the new file was refused",
            ["cluster"],
            registry=r,
        ).labels(cluster)
        self.config_reload_success.set(1)
        self.loop_errors = Counter(
            "sentinel_aggregator_loop_errors",
            "Errors the event loop or aiohttp reported outside any handler (accept failures: out of file "
            "descriptors), by kind; logged at most every 10 s per kind",
            ["cluster", "kind"],
            registry=r,
        )

    def detector_run(self, name: str, seconds: float, ok: bool) -> None:
        self._detector_seconds.labels(self.cluster, name).observe(max(0.0, seconds))
        self._detector_success.labels(self.cluster, name).set(1.0 if ok else 0.0)
        if not ok:
            self._detector_failures.labels(self.cluster, name).inc()

    def reload(self, ok: bool) -> None:
        self.config_reloads.labels(self.cluster, "applied" if ok else "refused").inc()
        self.config_reload_success.set(1.0 if ok else 0.0)

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self.cluster, reason).inc()

    def batch(self, host: HostView, batch: Batch, now: float, fresh: bool) -> None:
        if not fresh:
            self.n_duplicates += 1
            return
        self.n_batches += 1
        self.n_samples += len(batch.samples)
        self.n_events += len(batch.events)
        lag = now - batch.t
        if not 0.0 <= lag < 1e9:  # clock skew, NaN or nonsense
            lag = 0.0
        self.lag_counts[bisect.bisect_left(LAG_BUCKETS, lag)] += 1
        self.lag_sum += lag

    def verdict(self, change: Change) -> None:
        if change.what != "opened":
            return
        v = change.verdict
        self._opened.labels(self.cluster, v.kind, v.reason).inc()
        self._detection.labels(self.cluster, v.kind).observe(max(0.0, v.opened_at - v.evidence_t))

    def attach(self, engine: Engine, connected: Callable[[], int]) -> None:
        self.registry.register(FleetCollector(engine, self, connected))

    def ingest_families(self) -> Iterator[Metric]:
        cluster = self.cluster
        for name, documentation, value in (
            ("sentinel_ingest_batches", "Batches applied", self.n_batches),
            ("sentinel_ingest_samples", "GPU samples applied", self.n_samples),
            ("sentinel_ingest_events", "Events applied", self.n_events),
            (
                "sentinel_ingest_duplicates",
                "Resent batches recognised by (host, seq) and dropped",
                self.n_duplicates,
            ),
        ):
            family = CounterMetricFamily(name, documentation, labels=["cluster"])
            family.add_metric([cluster], float(value))
            yield family
        lag = HistogramMetricFamily(
            "sentinel_ingest_lag_seconds", "Aggregator receive time minus batch time", labels=["cluster"]
        )
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip([*LAG_BUCKETS, math.inf], self.lag_counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), float(cumulative)))
        lag.add_metric([cluster], buckets, self.lag_sum)
        yield lag

    def state_families(self) -> Iterator[Metric]:
        """The durable state store's health: errors (an alert watches them), writes, last commit."""
        store, cluster = self.store, self.cluster
        errors = self.state_errors + (store.write_errors if store is not None else 0)
        family = CounterMetricFamily(
            "sentinel_aggregator_state_errors",
            "Durable state store failures (open, snapshot, write, restore): verdicts may not survive a restart",
            labels=["cluster"],
        )
        family.add_metric([cluster], float(errors))
        yield family
        acks = self.acks
        if acks is not None:
            yield _single(
                "sentinel_aggregator_acks_waiting",
                "Acks of applied batches waiting for the state they changed to be committed",
                cluster,
                acks.waiting,
            )
            refused = CounterMetricFamily(
                "sentinel_aggregator_acks_refused",
                "Batches left unacked because their stream already had the most acks waiting (commits "
                "failing): the agent resends them after its next reconnect",
                labels=["cluster"],
            )
            refused.add_metric([cluster], float(acks.refused))
            yield refused
        if store is None:
            return
        failures = CounterMetricFamily(
            "sentinel_aggregator_state_commit_failures",
            "State store commits that failed (full disk, read-only or failing file system); each is kept and "
            "retried with backoff, and the batches it covers stay unacked until it succeeds",
            labels=["cluster"],
        )
        failures.add_metric([cluster], float(store.commit_failures))
        yield failures
        yield _single(
            "sentinel_aggregator_state_commit_lag_seconds",
            "Age of the oldest change handed to the state store and not yet committed (0: all on disk)",
            cluster,
            store.commit_lag(),
        )
        yield _single(
            "sentinel_aggregator_state_uncommitted_records",
            "Records handed to the state store and not yet committed",
            cluster,
            store.uncommitted_records,
        )
        written = CounterMetricFamily(
            "sentinel_aggregator_state_records_written",
            "Records committed to the state store",
            labels=["cluster"],
        )
        written.add_metric([cluster], float(store.records_written))
        yield written
        too_large = CounterMetricFamily(
            "sentinel_aggregator_state_snapshots_too_large",
            "Snapshots of a state member (a detector's memory) not written because they exceeded the "
            "per-member cap: a restart loses that member's warm start",
            labels=["cluster", "holder", "member"],
        )
        for holder in store.holders:
            if isinstance(holder, BuiltinsHolder):
                for member in holder.members:
                    too_large.add_metric(
                        [cluster, holder.state_name, member], float(holder.oversize_by_member.get(member, 0))
                    )
        yield too_large
        yield _single(
            "sentinel_aggregator_state_last_commit_timestamp_seconds",
            "Time of the state store's latest commit",
            cluster,
            store.last_commit_at,
        )


class FleetCollector(Collector):
    """Gauges computed from the engine's state at scrape time."""

    def __init__(self, engine: Engine, metrics: AggregatorMetrics, connected: Callable[[], int]) -> None:
        self.engine = engine
        self.metrics = metrics
        self.cluster = metrics.cluster
        self.connected = connected

    def collect(self) -> Iterator[Metric]:
        engine, cluster = self.engine, self.cluster
        yield from self.metrics.ingest_families()
        verdict_open = GaugeMetricFamily(
            "sentinel_verdict_open",
            "1 per open verdict",
            labels=["cluster", "kind", "reason", "action", "host", "gpu", "job", "rank"],
        )
        gpu_state: dict[tuple[str, int], str] = {}
        order = {state: i for i, state in enumerate(GPU_STATES)}
        for v in engine.book.open.values():
            verdict_open.add_metric(
                [cluster, v.kind, v.reason, v.action, _s(v.host), _s(v.gpu), _s(v.job), _s(v.rank)], 1.0
            )
            if v.host is not None and v.gpu is not None and v.kind in order:
                key = (v.host, v.gpu)
                known = gpu_state.get(key)
                if known is None or order[v.kind] > order[known]:
                    gpu_state[key] = v.kind
        yield verdict_open
        stalled = GaugeMetricFamily(
            "sentinel_job_stalled", "1 when the job's collectives are stalled", labels=["cluster", "job"]
        )
        ranks = GaugeMetricFamily("sentinel_job_ranks", "Ranks known for the job", labels=["cluster", "job"])
        for job in engine.fleet.jobs.values():
            stalled.add_metric([cluster, job.id], 1.0 if job.id in engine.stalls else 0.0)
            ranks.add_metric([cluster, job.id], float(len(job.ranks)))
        yield stalled
        yield ranks
        yield _single(
            "sentinel_jobs_stalled", "Jobs whose collectives are stalled", cluster, len(engine.stalls)
        )
        counts = dict.fromkeys(GPU_STATES, 0)
        last_seen = GaugeMetricFamily(
            "sentinel_host_last_seen_timestamp_seconds",
            "Time of the host's latest frame",
            labels=["cluster", "host"],
        )
        drops = CounterMetricFamily(
            "sentinel_agent_reported_drops",
            "What agents reported they had to drop (Batch.drops: spool full, oversize events, probe datagrams)",
            labels=["cluster", "host", "what"],
        )
        clock_rate = GaugeMetricFamily(
            "sentinel_host_clock_rate",
            "Agent clock seconds per aggregator second, from the batches' stamps (1: same speed; ranks on a "
            "host off by more than detect.straggler.max_clock_rate_error are not judged by compute time)",
            labels=["cluster", "host"],
        )
        clock_offset = GaugeMetricFamily(
            "sentinel_host_clock_offset_seconds",
            "Agent clock minus aggregator clock (least-delayed batch of the latest 10 s window)",
            labels=["cluster", "host"],
        )
        for host in engine.fleet.hosts.values():
            if host.last_seen > 0:
                last_seen.add_metric([host.cluster or cluster, host.name], host.last_seen)
            rate, offset = host.clock.rate, host.clock.offset_s
            if rate is not None:
                clock_rate.add_metric([host.cluster or cluster, host.name], rate)
            if offset is not None:
                clock_offset.add_metric([host.cluster or cluster, host.name], offset)
            for what, value in host.drops.items():
                drops.add_metric([host.cluster or cluster, host.name, what], float(value))
            for gpu in host.gpus:
                if gpu.state != "ok":
                    counts["lost"] += 1
                else:
                    counts[gpu_state.get((host.name, gpu.index), "healthy")] += 1
        gpus = GaugeMetricFamily("sentinel_gpus", "GPUs by health state", labels=["cluster", "state"])
        for state in GPU_STATES:
            gpus.add_metric([cluster, state], float(counts[state]))
        yield gpus
        yield last_seen
        yield drops
        yield clock_rate
        yield clock_offset
        future = CounterMetricFamily(
            "sentinel_ingest_future_stamped",
            "Samples, events and heads stamped more than limits.max_clock_skew_s ahead of the aggregator",
            labels=["cluster"],
        )
        future.add_metric([cluster], float(engine.fleet.future_stamped))
        yield future
        yield _single("sentinel_agents_connected", "Agents with an open stream", cluster, self.connected())
        yield from self.metrics.state_families()


def _single(name: str, documentation: str, cluster: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["cluster"])
    family.add_metric([cluster], float(value))
    return family

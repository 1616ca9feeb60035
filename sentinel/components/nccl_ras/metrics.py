"""The agent's ``sentinel_nccl_ras_*`` series: query outcomes (an alert watches the errors) and the latest
answer per job."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from sentinel.components.families import Collector, CounterMetricFamily, GaugeMetricFamily, Metric
from sentinel.components.nccl_ras.record import RasStatus

RESULTS = ("ok", "not_listening", "untrusted", "error")


class RasMetrics(Collector):
    def __init__(self, cluster: str, host: str) -> None:
        self.cluster = cluster
        self.host = host
        self.queries: dict[str, int] = defaultdict(int)
        self.latest: dict[str, RasStatus] = {}  # job → latest answer (bounded by the collector)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        base = [self.cluster, self.host]
        queries = CounterMetricFamily(
            "sentinel_nccl_ras_queries",
            "NCCL RAS status queries by result (not_listening: no RAS service on the host; untrusted: the "
            "port's listener is owned by neither root nor a user of the job, so it was not asked)",
            labels=["cluster", "host", "result"],
        )
        for result in RESULTS:
            queries.add_metric([*base, result], float(self.queries.get(result, 0)))
        yield queries
        healthy = GaugeMetricFamily(
            "sentinel_nccl_ras_healthy",
            "1 when the job's latest RAS answer reports no problem",
            labels=["cluster", "host", "job"],
        )
        missing = GaugeMetricFamily(
            "sentinel_nccl_ras_missing_processes",
            "job processes RAS got no data from",
            labels=["cluster", "host", "job"],
        )
        dead = GaugeMetricFamily(
            "sentinel_nccl_ras_dead_processes",
            "job processes RAS considers dead",
            labels=["cluster", "host", "job"],
        )
        for job, status in sorted(self.latest.items()):
            healthy.add_metric([*base, job], 1.0 if status.healthy else 0.0)
            missing.add_metric([*base, job], float(status.missing_process_count))
            dead.add_metric([*base, job], float(status.dead_process_count))
        yield from (healthy, missing, dead)

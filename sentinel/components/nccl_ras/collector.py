"""The agent's ``nccl_ras`` collector: query the local RAS service for the jobs whose rank 0 runs here.

RAS gives every node the job-wide view, and each query makes RAS gather data from every process of the
job, so one host per job asks — the one running global rank 0 — instead of all of them. The query runs as
a background task: a slow answer (RAS waits for unresponsive processes) never delays the tick; its result
ships with the first tick after it arrives. Nothing listening (no NCCL >= 2.24 job, or RAS disabled) is
normal: it is counted as ``not_listening`` and retried after ``refused_backoff_s``.

Before each query the port's listener is checked (:mod:`.owner`): owned by root or by a user of the queried
job's processes on this host, or it is not asked at all — counted as ``untrusted``, logged (once per
listener owner) and retried after ``refused_backoff_s``.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from sentinel.components.collector import Collector, Families, HostBuild, SourceSettings
from sentinel.components.nccl_ras.client import RasError, RasNotListening, query_status
from sentinel.components.nccl_ras.metrics import RasMetrics
from sentinel.components.nccl_ras.owner import ProcSocketTable, SocketTable, Trust, listener_trusted
from sentinel.components.nccl_ras.parse import parse_status
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.log import get_logger

log = get_logger(module="components.nccl_ras")
MAX_JOBS = 16


class RasUntrusted(RasError):
    """The RAS port's listener belongs to a user the agent may not trust for the job."""

    def __init__(self, trust: Trust) -> None:
        super().__init__(trust.why)
        self.trust = trust


class RasSink(Protocol):
    def ras_jobs(self) -> list[str]: ...

    def ras_job_pids(self, job: str) -> list[int]: ...

    def add_ras(self, status: RasStatus) -> None: ...


class RasSettings(SourceSettings, Protocol):
    """The agent's ``[nccl_ras]`` section."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def refused_backoff_s(self) -> float: ...


class TickSettings(Protocol):
    @property
    def tick_s(self) -> float: ...


class RasAgentConfig(Protocol):
    """What the ``nccl_ras`` collector reads of the agent's configuration."""

    @property
    def nccl_ras(self) -> RasSettings: ...
    @property
    def collect(self) -> TickSettings: ...


class RasBuild(HostBuild, Protocol):
    """What the ``nccl_ras`` collector is built from (the agent's build context)."""

    @property
    def config(self) -> RasAgentConfig: ...
    @property
    def sink(self) -> RasSink: ...


class RasCollector(Collector):
    name = "nccl_ras"

    def __init__(
        self,
        sink: RasSink,
        metrics: RasMetrics,
        *,
        host: str,
        port: int,
        interval_s: float,
        timeout_s: float,
        refused_backoff_s: float,
        tick_s: float,
        sockets: SocketTable | None = None,
    ) -> None:
        super().__init__(tick_s)
        self.sockets: SocketTable = sockets if sockets is not None else ProcSocketTable()
        self._untrusted_logged: tuple[int, ...] | None = None
        self.sink = sink
        self.metrics = metrics
        self.host = host
        self.port = port
        self.query_interval_s = interval_s
        self.timeout_s = timeout_s
        self.refused_backoff_s = refused_backoff_s
        self._task: asyncio.Task[str] | None = None
        self._task_job = ""
        self._task_t = 0.0
        self._next = 0.0

    async def collect(self, now: float) -> None:
        task = self._task
        if task is not None and task.done():
            self._task = None
            self._finish(task, now)
        if self._task is not None or now < self._next:
            return
        jobs = self.sink.ras_jobs()
        if not jobs:
            return
        job = jobs[0] if len(jobs) == 1 else sorted(jobs)[int(now / self.query_interval_s) % len(jobs)]
        self._task_job, self._task_t = job, now
        self._next = now + self.query_interval_s
        self._task = asyncio.create_task(self._query(self.sink.ras_job_pids(job)), name=f"nccl-ras-{job}")

    async def _query(self, job_pids: list[int]) -> str:
        """Check who listens (off the loop: /proc reads), then ask."""
        trust = await asyncio.to_thread(listener_trusted, self.sockets, self.port, job_pids)
        if not trust.trusted:
            if not trust.uids:
                raise RasNotListening(f"{self.host}:{self.port}: {trust.why}")
            raise RasUntrusted(trust)
        return await query_status(
            self.host,
            self.port,
            timeout_s=self.timeout_s,
            collective_timeout_s=max(1, int(self.timeout_s) - 1),
        )

    def _finish(self, task: asyncio.Task[str], now: float) -> None:
        try:
            text = task.result()
        except RasNotListening:
            self.metrics.queries["not_listening"] += 1
            self._next = max(self._next, now + self.refused_backoff_s)
            return
        except RasUntrusted as exc:
            self.metrics.queries["untrusted"] += 1
            self._next = max(self._next, now + self.refused_backoff_s)
            if exc.trust.uids != self._untrusted_logged:
                self._untrusted_logged = exc.trust.uids
                log.error(
                    "nccl_ras_listener_untrusted",
                    job=self._task_job,
                    port=self.port,
                    owner_uids=list(exc.trust.uids),
                    detail=exc.trust.why,
                )
            return
        except (RasError, OSError) as exc:
            self.metrics.queries["error"] += 1
            log.warning("nccl_ras_query_failed", job=self._task_job, error=str(exc)[:300])
            return
        self.metrics.queries["ok"] += 1
        self._untrusted_logged = None
        status = parse_status(text)
        status.t, status.job = self._task_t, self._task_job
        if status.unparsed:
            log.info("nccl_ras_unparsed_lines", job=self._task_job, lines=status.unparsed)
        latest = self.metrics.latest
        if self._task_job not in latest and len(latest) >= MAX_JOBS:
            latest.pop(next(iter(latest)))
        latest[self._task_job] = status
        self.sink.add_ras(status)

    def families(self) -> list[Families]:
        return [self.metrics]

    def close(self) -> None:
        super().close()
        if self._task is not None:
            self._task.cancel()


def build(ctx: RasBuild) -> RasCollector | None:
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

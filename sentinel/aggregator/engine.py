"""The aggregator's core without any I/O: fleet state, detectors and verdicts, driven by an injected clock.

The WebSocket server and ``sentinel sim`` both go through :class:`Engine` — ``hello`` and ``ingest`` for
what agents send, ``tick`` once per detector period — so the simulator exercises exactly the code path of
production, minus the socket.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sentinel.aggregator.detectors import hardware, host_silent, straggler, stuck
from sentinel.aggregator.state import FleetState, HostView
from sentinel.aggregator.verdicts import Change, Finding, Verdict, VerdictBook
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, Hello

Listener = Callable[[Change], None]


class EngineMetrics:
    """What the engine reports; the default does nothing (``sentinel sim``), the server's feeds Prometheus."""

    def batch(self, host: HostView, batch: Batch, now: float, fresh: bool) -> None:
        """A batch was applied (``fresh``) or recognised as a resend."""

    def verdict(self, change: Change) -> None:
        """A verdict opened, changed or closed."""


class Engine:
    def __init__(
        self, config: AggregatorConfig | None = None, *, metrics: EngineMetrics | None = None
    ) -> None:
        self.config = config or AggregatorConfig()
        self.metrics = metrics or EngineMetrics()
        self.fleet = FleetState(
            ema_window_s=self.config.detect.straggler.ema_window_s,
            max_gpus_per_host=self.config.limits.max_gpus_per_host,
            max_jobs=self.config.limits.max_jobs,
            max_ranks_per_job=self.config.limits.max_ranks_per_job,
            xid_config=self.config.detect.xid,
        )
        self.book = VerdictBook(closed_kept=self.config.fleet.closed_verdicts_kept)
        self.streaks: dict[tuple[str, ...], straggler.Streak] = {}
        self.stalls: dict[str, stuck.Stall] = {}
        self.listeners: list[Listener] = []
        self._next_straggler = -math.inf
        self.last_tick = -math.inf

    # -- input ----------------------------------------------------------------------------------------

    def hello(self, hello: Hello, now: float) -> HostView:
        host = self.fleet.hello(hello, now)
        self._hardware(now)
        return host

    def ingest(self, host: HostView, batch: Batch, now: float) -> bool:
        """Apply a batch; hardware verdicts for the GPUs it changed open right here, within the tick."""
        fresh = self.fleet.apply(host, batch, now)
        self.metrics.batch(host, batch, now, fresh)
        if fresh and self.fleet.dirty_gpus:
            self._hardware(now)
        return fresh

    def disconnected(self, host: str) -> None:
        self.fleet.disconnected(host)

    # -- detection ------------------------------------------------------------------------------------

    def _hardware(self, now: float) -> list[Change]:
        gpus = self.fleet.take_dirty()
        if not gpus:
            return []
        cfg = self.config.detect.hardware
        findings: list[Finding] = []
        keys = set()
        for gpu in gpus:
            keys.add(hardware.gpu_key(gpu.host, gpu.index))
            findings.extend(hardware.evaluate_gpu(gpu, cfg, now, self.config.detect.ecc))
        changes = self.book.reconcile(hardware.DETECTOR, findings, now, scope=keys.__contains__)
        self._emit(changes)
        return changes

    def tick(self, now: float) -> list[Change]:
        """Run every detector once; returns what changed (also sent to the listeners)."""
        self.last_tick = now
        cfg = self.config
        changes: list[Change] = []
        # hardware verdicts whose evidence fades with time (error rates) are re-checked every tick
        for verdict in list(self.book.open.values()):
            if verdict.detector == hardware.DETECTOR:
                gpu = self.fleet.gpu(verdict.host or "", verdict.gpu)
                if gpu is not None and not gpu.dirty:
                    gpu.dirty = True
                    self.fleet.dirty_gpus.append(gpu)
        changes.extend(self._hardware(now))
        self._end_jobs(now)
        stuck_findings: list[Finding] = []
        stalls: dict[str, stuck.Stall] = {}
        fresh_s = cfg.detect.stuck.heads_fresh_s
        for job in self.fleet.jobs.values():
            if job.heads_dirty:
                job.heads_dirty = False
                straggler.measure_lateness(job, now, fresh_s)
            found, stall = stuck.evaluate_job(job, self.fleet, cfg.detect.stuck, cfg.detect.hardware, now)
            stuck_findings.extend(found)
            if stall is not None:
                stalls[job.id] = stall
        self.stalls = stalls
        changes.extend(self._reconcile(stuck.DETECTOR, stuck_findings, now))
        if now >= self._next_straggler:
            self._next_straggler = now + cfg.detect.straggler.eval_interval_s
            found = straggler.evaluate(self.fleet, cfg.detect.straggler, now, self.streaks, set(stalls))
            changes.extend(self._reconcile(straggler.DETECTOR, found, now))
        silent = host_silent.evaluate(self.fleet, cfg.fleet.host_silent_after_s, now)
        changes.extend(self._reconcile(host_silent.DETECTOR, silent, now))
        return changes

    def _reconcile(self, detector: str, findings: list[Finding], now: float) -> list[Change]:
        changes = self.book.reconcile(detector, findings, now)
        self._emit(changes)
        return changes

    def _end_jobs(self, now: float) -> None:
        gone_after = self.config.fleet.job_gone_after_s
        ended = [
            job.id
            for job in self.fleet.jobs.values()
            if now - job.last_seen > gone_after and not any(r.alive for r in job.ranks.values())
        ]
        for job_id in ended:
            del self.fleet.jobs[job_id]
            for key, verdict in list(self.book.open.items()):
                if verdict.job == job_id and verdict.detector in (stuck.DETECTOR, straggler.DETECTOR):
                    change = self.book.close(key, now, "job ended")
                    if change is not None:
                        self._emit([change])

    def _emit(self, changes: list[Change]) -> None:
        for change in changes:
            self.metrics.verdict(change)
            for listener in self.listeners:
                listener(change)

    # -- queries --------------------------------------------------------------------------------------

    def verdicts(self, state: str | None = None) -> list[Verdict]:
        if state == "open":
            return list(self.book.open.values())
        if state == "closed":
            return list(self.book.closed)
        return self.book.all()

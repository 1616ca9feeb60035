"""The aggregator's core without any I/O: fleet state, detectors and verdicts, driven by an injected clock.

The WebSocket server and ``sentinel sim`` both go through :class:`Engine` — ``hello`` and ``ingest`` for
what agents send, ``tick`` once per detector period — so the simulator exercises exactly the code path of
production, minus the socket.

Detectors follow :mod:`sentinel.aggregator.detectors.base`: each one is run in isolation (an exception is
counted, logged and leaves that detector's open verdicts as they were; the others still run), timed for
``sentinel_aggregator_detector_duration_seconds``, and can be switched off in ``detect.disabled``.
:meth:`Engine.reconfigure` applies a reloaded configuration without losing state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.detectors.hardware import HardwareDetector
from sentinel.aggregator.detectors.host_health import HostHealthDetector
from sentinel.aggregator.detectors.host_silent import HostSilentDetector
from sentinel.aggregator.detectors.inventory import InventoryDetector
from sentinel.aggregator.detectors.link_pace import LinkPaceDetector
from sentinel.aggregator.detectors.network import NetworkDetector
from sentinel.aggregator.detectors.straggler import RankJudgement, StragglerDetector
from sentinel.aggregator.detectors.stuck import DumpJudgement, Stall, StuckDetector
from sentinel.aggregator.state import FleetState, HostView
from sentinel.aggregator.verdicts import Change, Verdict, VerdictBook
from sentinel.components import registry as signals
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, Hello

Listener = Callable[[Change], None]
log = structlog.get_logger("sentinel.aggregator.engine")

_CLASSES: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        HardwareDetector,
        StuckDetector,
        StragglerDetector,
        HostSilentDetector,
        HostHealthDetector,
        InventoryDetector,
        NetworkDetector,
        LinkPaceDetector,
    )
}
#: every detector of the registry (:data:`sentinel.components.registry.DETECTORS`), in the order a tick
#: runs them; a name without a class fails at import
DETECTORS: tuple[type[Detector], ...] = tuple(_CLASSES[name] for name in signals.DETECTORS)
#: verdicts of these detectors are about a job and close when the job ends
JOB_DETECTORS = frozenset({StuckDetector.name, StragglerDetector.name, LinkPaceDetector.name})


class EngineMetrics:
    """What the engine reports; the default does nothing (``sentinel sim``), the server's feeds Prometheus."""

    def batch(self, host: HostView, batch: Batch, now: float, fresh: bool) -> None:
        """A batch was applied (``fresh``) or recognised as a resend."""

    def verdict(self, change: Change) -> None:
        """A verdict opened, changed or closed."""

    def detector_run(self, name: str, seconds: float, ok: bool) -> None:
        """A detector ran (``ok``) or raised; ``seconds`` of real time either way."""


class Engine:
    def __init__(
        self,
        config: AggregatorConfig | None = None,
        *,
        metrics: EngineMetrics | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config or AggregatorConfig()
        self.metrics = metrics or EngineMetrics()
        self.timer = timer
        self.fleet = FleetState(
            ema_window_s=self.config.detect.straggler.ema_window_s,
            max_gpus_per_host=self.config.limits.max_gpus_per_host,
            max_jobs=self.config.limits.max_jobs,
            max_ranks_per_job=self.config.limits.max_ranks_per_job,
            xid_config=self.config.detect.xid,
            max_clock_skew_s=self.config.limits.max_clock_skew_s,
        )
        self.book = VerdictBook(closed_kept=self.config.fleet.closed_verdicts_kept)
        self.detectors: dict[str, Detector] = {cls.name: cls(self.config) for cls in DETECTORS}
        self.failures: dict[str, int] = dict.fromkeys(self.detectors, 0)
        #: hosts forgotten while a sliced detector run is suspended between its steps (see _run_steps)
        self._forgotten_in_run: set[str] | None = None
        self.listeners: list[Listener] = []
        #: called with a host's name once it is forgotten (after its verdicts closed): holders of per-host
        #: memory outside the engine drop theirs
        self.forget_listeners: list[Callable[[str], None]] = []
        self.last_tick = -float("inf")

    # -- configuration --------------------------------------------------------------------------------

    @property
    def enabled(self) -> list[Detector]:
        off = set(self.config.detect.disabled)
        return [d for name, d in self.detectors.items() if name not in off]

    def reconfigure(self, config: AggregatorConfig, now: float) -> list[Change]:
        """Apply a reloaded configuration: new thresholds, detectors switched on or off; state is kept.

        The verdicts of a detector switched off close at once ("detector disabled"): an alert on-call
        silences this way must stop firing.
        """
        was_off = set(self.config.detect.disabled)
        self.config = config
        off = set(config.detect.disabled)
        for name, detector in self.detectors.items():
            detector.configure(config)
            if name in was_off and name not in off:
                detector.switched_on()
        changes: list[Change] = []
        for key, verdict in list(self.book.open.items()):
            if verdict.detector in off:
                change = self.book.close(key, now, "detector disabled")
                if change is not None:
                    changes.append(change)
        self._emit(changes)
        return changes

    # -- input ----------------------------------------------------------------------------------------

    def hello(self, hello: Hello, now: float) -> HostView:
        host = self.fleet.hello(hello, now)
        self._on_ingest(now)
        return host

    def ingest(self, host: HostView, batch: Batch, now: float) -> bool:
        """Apply a batch; hardware verdicts for the GPUs it changed open right here, within the tick."""
        fresh = self.fleet.apply(host, batch, now)
        self.metrics.batch(host, batch, now, fresh)
        if fresh and self.fleet.dirty_gpus:
            self._on_ingest(now)
        return fresh

    def disconnected(self, host: str) -> None:
        self.fleet.disconnected(host)

    # -- detection ------------------------------------------------------------------------------------

    def _on_ingest(self, now: float) -> list[Change]:
        seen = Observation(self.fleet, now, self.fleet.take_dirty(), tick=False)
        if not seen.changed_gpus:
            return []
        changes: list[Change] = []
        for detector in self.enabled:
            if detector.on_ingest:
                changes.extend(self._run(detector, seen))
        return changes

    def tick(self, now: float) -> list[Change]:
        """Run every enabled detector once, each in isolation; returns what changed (also to the listeners)."""
        changes: list[Change] = []
        for stage in self.tick_stages(now):
            changes.extend(stage)
        return changes

    def tick_stages(self, now: float) -> Iterator[list[Change]]:
        """:meth:`tick` one step at a time: job/host retention, then one detector per step.

        The server resumes its event loop between steps, so the batches that arrived meanwhile are ingested
        (and their hardware verdicts opened) after at most one step instead of after the whole tick. At job
        scale the stuck, straggler and inventory runs would hold the loop for a long time in one piece;
        they are sliced (:meth:`Detector.evaluate_steps`, a yield every few thousand ranks or
        GPUs), so a step is tens of milliseconds and ingest-to-verdict latency stays bounded. ``tick``
        runs the same steps back to back: same findings.
        """
        self.last_tick = now
        changes = self._end_jobs(now)
        for name in self.fleet.silent_hosts(now, self.config.fleet.host_forget_after_s)[:100]:
            changes.extend(self.forget_host(name, now))
        yield changes
        seen = Observation(self.fleet, now, self.fleet.take_dirty(), tick=True)
        for detector in self.enabled:
            if detector.name in self.config.detect.disabled:  # switched off by a reload between two steps
                continue
            yield from self._run_steps(detector, seen)

    def _run_steps(self, detector: Detector, seen: Observation) -> Iterator[list[Change]]:
        """:meth:`_run` over :meth:`Detector.evaluate_steps`: a step per yield of the detector (its duration
        metric is the sum of its steps), its findings reconciled after the last.

        What happened between its steps is honoured at the end: a detector switched off by a reload
        meanwhile reconciles nothing (its verdicts were closed by the reload and nothing would close them
        again), and findings about a host forgotten meanwhile are dropped (its verdicts were closed with it).
        """
        steps = detector.evaluate_steps(seen)
        spent = 0.0
        self._forgotten_in_run = forgotten = set[str]()
        while True:
            started = self.timer()
            try:
                next(steps)
            except StopIteration as done:
                spent += self.timer() - started
                evaluation: Evaluation | None = done.value
                break
            except Exception as exc:  # one broken rule must not silence the others
                self._failed(detector, spent + self.timer() - started, exc)
                self._forgotten_in_run = None
                return
            spent += self.timer() - started
            yield []
        self.metrics.detector_run(detector.name, spent, True)
        self._forgotten_in_run = None
        if evaluation is None or detector.name in self.config.detect.disabled:
            yield []
            return
        findings = evaluation.findings
        if forgotten:
            findings = [f for f in findings if f.host not in forgotten]
        changes = self.book.reconcile(detector.name, findings, seen.now, scope=evaluation.scope)
        self._emit(changes)
        yield changes

    def _failed(self, detector: Detector, seconds: float, exc: Exception) -> None:
        self.failures[detector.name] += 1
        self.metrics.detector_run(detector.name, seconds, False)
        log.error(
            "detector_failed",
            detector=detector.name,
            error=f"{type(exc).__name__}: {exc}",
            failures=self.failures[detector.name],
            exc_info=exc,
        )

    def _run(self, detector: Detector, seen: Observation) -> list[Change]:
        started = self.timer()
        try:
            evaluation: Evaluation | None = detector.evaluate(seen)
        except Exception as exc:  # one broken rule must not silence the others
            self._failed(detector, self.timer() - started, exc)
            return []
        self.metrics.detector_run(detector.name, self.timer() - started, True)
        if evaluation is None:
            return []
        changes = self.book.reconcile(detector.name, evaluation.findings, seen.now, scope=evaluation.scope)
        self._emit(changes)
        return changes

    def _end_jobs(self, now: float) -> list[Change]:
        gone_after = self.config.fleet.job_gone_after_s
        ended = [
            job.id
            for job in self.fleet.jobs.values()
            if now - job.last_seen > gone_after and not job.running(now, gone_after)
        ]
        changes: list[Change] = []
        for job_id in ended:
            self.fleet.end_job(job_id)
            for detector in self.detectors.values():
                detector.job_ended(job_id)
            for key, verdict in list(self.book.open.items()):
                if verdict.job == job_id and verdict.detector in JOB_DETECTORS:
                    change = self.book.close(key, now, "job ended")
                    if change is not None:
                        changes.append(change)
        self._emit(changes)
        return changes

    def forget_host(self, name: str, now: float) -> list[Change]:
        """Forget a host (retention, or room for a new one at ``limits.max_hosts``): its open verdicts close
        and every detector, and every forget listener, drops what it remembers about it."""
        self.fleet.forget_host(name)
        if self._forgotten_in_run is not None:
            self._forgotten_in_run.add(name)
        for detector in self.detectors.values():
            detector.host_forgotten(name)
        changes: list[Change] = []
        for key, verdict in list(self.book.open.items()):
            if verdict.host == name:
                change = self.book.close(key, now, "host forgotten")
                if change is not None:
                    changes.append(change)
        self._emit(changes)
        for listener in self.forget_listeners:
            listener(name)
        return changes

    def _emit(self, changes: list[Change]) -> None:
        for change in changes:
            self.metrics.verdict(change)
            for listener in self.listeners:
                listener(change)

    # -- queries --------------------------------------------------------------------------------------

    @property
    def stalls(self) -> dict[str, Stall]:
        """Jobs found stalled at the latest run of the enabled detectors (the stuck detector's)."""
        out: dict[str, Stall] = {}
        for detector in self.enabled:
            out.update(detector.stalled_jobs())
        return out

    def join_dumps(self, job: str, analysis: Mapping[str, Any] | None) -> str | None:
        """A stalled job's Flight Recorder dumps were analyzed: confirm, correct or mark its stuck verdicts
        inconclusive (applied from the next tick on); the outcome, or None when the job no longer stalls."""
        for detector in self.detectors.values():
            judged: DumpJudgement | None = detector.join_dumps(job, analysis)
            if judged is not None:
                log.info(
                    "stall_dumps_joined", job=job, outcome=judged.outcome, culprits=list(judged.culprits)
                )
                return judged.outcome
        return None

    def rank_judgement(self, job: str, rank: int) -> RankJudgement | None:
        """A rank's compute time as a detector judged it (the straggler detector's), or None."""
        for detector in self.detectors.values():
            judged: RankJudgement | None = detector.rank_judgement(job, rank)
            if judged is not None:
                return judged
        return None

    def verdicts(self, state: str | None = None) -> list[Verdict]:
        if state == "open":
            return list(self.book.open.values())
        if state == "closed":
            return list(self.book.closed)
        return self.book.all()

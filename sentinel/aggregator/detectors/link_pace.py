"""Link-pace detector: the job that runs slower than its own baseline because one of its links is slow.

Per job it measures its pace (step time from the step group's completed collectives over a window, against
the median of its own earlier windows; compute per step from the ranks' step clocks) and per link serving
it the load over the same window: an IB/RoCE port whose GPUs run the job's ranks (the PCI affinity the
agent reports), else, on a host whose job traffic runs over sockets, each busy network interface. The
judgement is :mod:`sentinel.components.linkpace.rule`; a link named ``persistence`` evaluations in a row
opens a ``link_slow`` verdict with the cost in its evidence. The baseline stops taking new windows while a
link stands out in a slower job, so a long slowdown is not learnt as normal; a job uniformly slower with no
link standing out re-baselines over ``baseline_s``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sentinel.aggregator.detectors.base import (
    ITEMS_PER_STEP,
    Detector,
    Evaluation,
    Key,
    Observation,
    Steps,
    run_steps,
)
from sentinel.aggregator.state import FleetState, HostView, JobView
from sentinel.aggregator.verdicts import Finding
from sentinel.components.linkpace.load import netdev_load, port_load
from sentinel.components.linkpace.rule import (
    JobPace,
    LinkFinding,
    LinkLoad,
    LinkPaceConfig,
    judge,
    pace_evidence,
    standouts,
)
from sentinel.config.aggregator import AggregatorConfig
from sentinel.fr.steps import STEP_GROUP
from sentinel.stats import median

DETECTOR = "link_pace"
REASON = "link_slow"
#: links remembered per host, and readings per link (a window of 2 s readings, with room)
MAX_LINKS_PER_HOST = 64
MAX_READINGS = 256
MAX_PACE_POINTS = 4096
#: a window needs this many completed steps to give a step time
MIN_STEPS = 3


@dataclass(slots=True)
class LinkHistory:
    """One link's readings: (agent time, bytes per second, wait rates)."""

    readings: deque[tuple[float, float, dict[str, float]]] = field(
        default_factory=lambda: deque(maxlen=MAX_READINGS)
    )


@dataclass(slots=True)
class PaceHistory:
    """One job's progress points (aggregator time, step-group seq) and its past windows' paces."""

    progress: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_PACE_POINTS))
    windows: deque[tuple[float, float, float | None]] = field(
        default_factory=lambda: deque(maxlen=MAX_PACE_POINTS)
    )


@dataclass(slots=True)
class Streak:
    hits: int = 0
    misses: int = 0
    finding: Finding | None = None


def _average(
    readings: deque[tuple[float, float, dict[str, float]]], since: float
) -> tuple[float, dict[str, float]]:
    n = 0
    data = 0.0
    waits: dict[str, float] = {}
    for t, d, w in readings:
        if t < since:
            continue
        n += 1
        data += d
        for name, value in w.items():
            waits[name] = waits.get(name, 0.0) + value
    if not n:
        return 0.0, {}
    return data / n, {name: total / n for name, total in waits.items()}


def _step_group(job: JobView) -> tuple[int, float] | None:
    progress = job.pg_progress
    if STEP_GROUP in progress:
        return progress[STEP_GROUP]
    return max(progress.values(), default=None)


def _compute_s(job: JobView) -> Steps[float | None]:
    """The ranks' median compute per step (each rank's median over the steps its latest heads carry); a
    yield every :data:`ITEMS_PER_STEP` ranks."""
    per_rank = []
    for index, view in enumerate(list(job.ranks.values())):
        if index % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
            yield
        heads = view.heads
        if heads is not None and heads.steps:
            per_rank.append(median([s.compute_s for s in heads.steps]))
    return median(per_rank) if per_rank else None


def _job_hosts(fleet: FleetState) -> Steps[set[str]]:
    """The hosts running a rank of some job; a yield every :data:`ITEMS_PER_STEP` ranks."""
    out: set[str] = set()
    counted = 0
    for job in list(fleet.jobs.values()):
        for view in list(job.ranks.values()):
            counted += 1
            if counted % ITEMS_PER_STEP == 0:
                yield
            if view.host is not None:
                out.add(view.host)
    return out


def step_time(points: list[tuple[float, int]], now: float) -> float | None:
    """Seconds per step: the least-squares slope of (time, completed seq) over the window, so the 1-2 s
    spacing of the heads that carry the progress averages out; a job that has not completed a step for
    longer than two steps counts as having reached its last seq only now (it is slower by that wait)."""
    mean_t = sum(t for t, _ in points) / len(points)
    mean_s = sum(s for _, s in points) / len(points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return None
    slope = sum((t - mean_t) * (s - mean_s) for t, s in points) / var
    if slope <= 0:
        return None
    last_t, last_seq = points[-1]
    if now - last_t > 2.0 / slope:
        return step_time([*points, (now, last_seq)], -math.inf)
    return 1.0 / slope


class LinkPaceDetector(Detector):
    """Owns each job's pace history, each link's window of readings and the candidates' streaks."""

    name = DETECTOR

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self.links: dict[str, dict[str, LinkHistory]] = {}
        self.seen_at: dict[str, tuple[float, float]] = {}  # host → (ports_t, netdevs_t) folded in
        self.paces: dict[str, PaceHistory] = {}
        self.streaks: dict[Key, Streak] = {}
        self.next_eval = -math.inf
        #: hosts running a rank of some job at the latest evaluation: only their links are remembered
        self.job_hosts: set[str] = set()
        #: job → its latest pace (for the API and the evidence of tests)
        self.latest: dict[str, JobPace] = {}

    def job_ended(self, job: str) -> None:
        self.paces.pop(job, None)
        self.latest.pop(job, None)
        for key in [k for k in self.streaks if k[3] == job]:
            del self.streaks[key]

    def host_forgotten(self, host: str) -> None:
        self.job_hosts.discard(host)
        self.links.pop(host, None)
        self.seen_at.pop(host, None)
        for key in [k for k in self.streaks if k[1] == host]:
            del self.streaks[key]

    def snapshot(self) -> dict[str, Any]:
        return {
            "paces": {
                job: {"step_s": p.step_s, "baseline_step_s": p.baseline_step_s, "compute_s": p.compute_s,
                      "baseline_compute_s": p.baseline_compute_s, "slowdown": p.slowdown}
                for job, p in self.latest.items()
            }
        }  # fmt: skip

    def evaluate(self, seen: Observation) -> Evaluation | None:
        return run_steps(self.evaluate_steps(seen))

    def evaluate_steps(self, seen: Observation) -> Steps[Evaluation | None]:
        """Sliced over the jobs' ranks (a yield every :data:`ITEMS_PER_STEP`): the hosts they run on, their
        compute per step and the links serving them are each a pass over every rank of every job."""
        cfg = self.config.detect.link_pace
        fleet, now = seen.fleet, seen.now
        for name in self.job_hosts:
            host = fleet.hosts.get(name)
            if host is not None:
                self._fold(host, cfg)
        for job in fleet.jobs.values():
            self._progress(job)
        if now < self.next_eval:
            return None
        self.next_eval = now + cfg.eval_interval_s
        if not cfg.enabled:
            self.streaks.clear()
            return Evaluation([])
        self.job_hosts = yield from _job_hosts(fleet)
        for name in [h for h in self.links if h not in self.job_hosts]:
            del self.links[name]
            self.seen_at.pop(name, None)
        hits: dict[Key, LinkFinding] = {}
        for job in list(fleet.jobs.values()):
            pace = yield from self._pace(job, cfg, now)
            if pace is None:
                continue
            links = yield from self._job_links(fleet, job, cfg)
            found = judge(pace, links, cfg)
            held = bool(found) or (pace_evidence(pace, cfg) is not None and bool(standouts(links, cfg)))
            history = self.paces.get(job.id)  # (None: the job ended while the run was sliced)
            if not held and history is not None:
                history.windows.append((now, pace.step_s, pace.compute_s))
            for f in found:
                hits[(DETECTOR, f.host, f.link, f.job)] = f
        return Evaluation(self._streaks(hits, cfg, now))

    # -- links ------------------------------------------------------------------------------------------

    def _fold(self, host: HostView, cfg: LinkPaceConfig) -> None:
        folded = self.seen_at.get(host.name, (-math.inf, -math.inf))
        if (host.ports_t, host.netdevs_t) == folded:
            return
        links = self.links.setdefault(host.name, {})
        if host.ports_t > folded[0]:
            for port in host.ports.values():
                if port.up and port.rates:
                    self._add(links, port.key, host.ports_t, *port_load(port))
        if host.netdevs_t > folded[1]:
            for netdev in host.netdevs.values():
                if netdev.rates:
                    self._add(links, f"netdev:{netdev.name}", host.netdevs_t, *netdev_load(netdev))
        self.seen_at[host.name] = (host.ports_t, host.netdevs_t)
        horizon = max(host.ports_t, host.netdevs_t) - cfg.window_s
        for key, history in list(links.items()):
            readings = history.readings
            while readings and readings[0][0] < horizon:
                readings.popleft()
            if not readings:
                del links[key]

    @staticmethod
    def _add(links: dict[str, LinkHistory], key: str, t: float, data: float, waits: dict[str, float]) -> None:
        history = links.get(key)
        if history is None:
            if len(links) >= MAX_LINKS_PER_HOST:
                return
            history = links[key] = LinkHistory()
        history.readings.append((t, data, waits))

    def _job_links(self, fleet: FleetState, job: JobView, cfg: LinkPaceConfig) -> Steps[list[LinkLoad]]:
        by_host: dict[str, dict[int, int]] = {}  # host → gpu → rank
        ranks_on: dict[str, list[int]] = {}
        for index, view in enumerate(list(job.ranks.values())):
            if index % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
                yield
            if view.host is None or not view.alive:
                continue
            ranks_on.setdefault(view.host, []).append(view.rank)
            if view.gpu is not None:
                by_host.setdefault(view.host, {})[view.gpu] = view.rank
        out: list[LinkLoad] = []
        for name in sorted(ranks_on):
            host = fleet.hosts.get(name)
            histories = self.links.get(name)
            if host is None or not histories:
                continue
            gpus = by_host.get(name, {})
            since = max(host.ports_t, host.netdevs_t) - cfg.window_s
            on_ports = False
            for key, port in sorted(host.ports.items()):
                served = tuple(g for g in port.gpus if g in gpus)
                history = histories.get(key)
                if not served or history is None:
                    continue
                on_ports = True
                data, waits = _average(history.readings, since)
                ranks = tuple(sorted(gpus[g] for g in served))
                out.append(
                    LinkLoad(host=name, link=key, bytes_per_s=data, waits=waits, gpus=served, ranks=ranks)
                )
            if on_ports:
                continue  # the job's traffic runs on the host's HCAs
            for key, history in sorted(histories.items()):
                if not key.startswith("netdev:"):
                    continue
                data, waits = _average(history.readings, since)
                if data >= cfg.idle_bytes_per_s:
                    out.append(
                        LinkLoad(
                            host=name,
                            link=key,
                            bytes_per_s=data,
                            waits=waits,
                            ranks=tuple(sorted(ranks_on[name])),
                        )
                    )
        return out

    # -- pace -------------------------------------------------------------------------------------------

    def _progress(self, job: JobView) -> None:
        point = _step_group(job)
        if point is None:
            return
        seq, when = point
        history = self.paces.setdefault(job.id, PaceHistory())
        last = history.progress[-1] if history.progress else None
        if last is None or seq > last[1]:
            history.progress.append((when, seq))
        elif seq < last[1]:  # a restarted job counts from 0 again: its history starts over
            history.progress.clear()
            history.windows.clear()
            history.progress.append((when, seq))

    def _pace(self, job: JobView, cfg: LinkPaceConfig, now: float) -> Steps[JobPace | None]:
        history = self.paces.get(job.id)
        if history is None:
            return None
        progress = history.progress
        while progress and progress[0][0] < now - 2 * cfg.window_s - cfg.baseline_s:
            progress.popleft()
        windows = history.windows
        while windows and windows[0][0] < now - cfg.baseline_s - cfg.window_s:
            windows.popleft()
        recent = [p for p in progress if p[0] >= now - cfg.window_s]
        if len(recent) < 2 or recent[-1][1] - recent[0][1] < MIN_STEPS:
            return None
        step_s = step_time(recent, now)
        if step_s is None:
            return None
        compute = yield from _compute_s(job)
        old = [w for w in windows if w[0] <= now - cfg.window_s]
        if len(old) < 3 or old[-1][0] - old[0][0] < cfg.window_s:
            windows.append((now, step_s, compute))
            return None
        computes = [w[2] for w in old if w[2] is not None]
        pace = JobPace(
            job=job.id,
            step_s=step_s,
            baseline_step_s=median([w[1] for w in old]),
            compute_s=compute,
            baseline_compute_s=median(computes) if computes else None,
        )
        self.latest[job.id] = pace
        return pace

    # -- streaks ----------------------------------------------------------------------------------------

    def _streaks(self, hits: dict[Key, LinkFinding], cfg: LinkPaceConfig, now: float) -> list[Finding]:
        out: list[Finding] = []
        for key in set(self.streaks) | set(hits):
            streak = self.streaks.setdefault(key, Streak())
            f = hits.get(key)
            if f is not None:
                streak.hits += 1
                streak.misses = 0
                if streak.hits >= cfg.persistence or streak.finding is not None:
                    streak.finding = Finding(
                        key=key,
                        detector=DETECTOR,
                        kind="degraded",
                        reason=REASON,
                        action="drain",
                        evidence=f.evidence,
                        evidence_t=now,
                        host=f.host,
                        gpu=f.gpus[0] if len(f.gpus) == 1 else None,
                        job=f.job,
                        rank=f.ranks[0] if len(f.ranks) == 1 else None,
                    )
            else:
                streak.misses += 1
                streak.hits = 0
                if streak.finding is None or streak.misses >= cfg.persistence:
                    del self.streaks[key]
                    continue
            if streak.finding is not None:
                out.append(streak.finding)
        return out

"""Straggler detector: the GPU, rank or host that is slower than its peers, and why.

Two robust peer comparisons (median and MAD from :mod:`sentinel.stats`, so one sick GPU does not move the
yardstick; each host one vote, its GPUs or ranks weighted 1/n, so one host claiming many does not either): the SM clock across identical busy GPUs (with temperature, power and throttle reasons saying
why), and each rank's own compute time per step inside its job (waiting inside a collective is not compute,
so a peer waiting for the straggler is never blamed). Most GPUs of a host standing out together make one
host verdict. A candidate must stand out ``persistence`` evaluations in a row to open or close a verdict.
A finding carries how many hosts other than its own the comparison rested on (``Finding.learned_from``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import msgspec

from sentinel.aggregator.clock import RATE_KNOWN_AFTER_S
from sentinel.aggregator.detectors.base import (
    ITEMS_PER_STEP,
    Detector,
    Evaluation,
    Key,
    Observation,
    Steps,
    run_steps,
)
from sentinel.aggregator.state import FleetState, JobView, RankView
from sentinel.aggregator.verdicts import Finding
from sentinel.components.clocks.rule import REASON_SHARE
from sentinel.components.clocks.rule import describe as describe_violations
from sentinel.components.gpu_view import GpuView
from sentinel.components.nvlink.signal import error_rate as nvlink_error_rate
from sentinel.components.vocab import Action
from sentinel.config.aggregator import AggregatorConfig, HardwareConfig, StragglerConfig
from sentinel.log import get_logger
from sentinel.stats import MAD_SCALE, host_median_mad, median

DETECTOR = "straggler"


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.straggler")


#: the robust scale never falls below this share of the median compute time (identical ranks: MAD 0)
_MIN_SCALE_FRACTION = 0.005


@dataclass(slots=True)
class Streak:
    hits: int = 0
    misses: int = 0
    finding: Finding | None = None
    #: restored from the store and not seen since: a miss while the fleet's view is being rebuilt (the
    #: agents' first heads after a restart) is no evidence that the straggler is gone
    restored: bool = False


@dataclass(slots=True)
class RankSteps:
    """One rank's recent compute times per step (its own clock), newest last."""

    last_seq: int = -1
    compute: deque[float] = field(default_factory=deque)
    heads_at: float = -math.inf  # aggregator time of the heads last folded in


class _RankMemory(msgspec.Struct, array_like=True):
    last_seq: int
    compute: list[float]


class _StreakMemory(msgspec.Struct, array_like=True):
    key: tuple[str, ...]
    hits: int
    misses: int


class StragglerMemory(msgspec.Struct, kw_only=True):
    """What the detector keeps across a restart (the aggregator's state store): each rank's step history,
    with the last step folded in so the heads that still carry it are not counted twice, and each
    candidate's streak, so a straggler three evaluations into its ``persistence`` is not started over."""

    steps: dict[str, dict[int, _RankMemory]] = {}
    streaks: list[_StreakMemory] = []


@dataclass(slots=True)
class RankJudgement:
    """A rank's place among its job's peers at the latest evaluation (for evidence and the API)."""

    median_s: float
    job_median_s: float
    steps: int
    z: float

    @property
    def slowdown(self) -> float:
        return self.median_s / self.job_median_s if self.job_median_s > 0 else 1.0


def _reason(gpu: GpuView | None, hw: HardwareConfig) -> str:
    """Why a slow GPU is slow, from what it reports: held back by heat or by its power limit (the share of
    time from NVML's violation counters, else the share of ticks whose reason bits said so), or its NVLink
    errors climbing (replays cost bandwidth, so its collectives run late)."""
    if gpu is None:
        return "unknown"
    share = gpu.violation_share
    if max(gpu.ema_thermal, share.get("thermal", 0.0)) >= REASON_SHARE:
        return "thermal"
    if max(gpu.ema_power_cap, share.get("power", 0.0)) >= REASON_SHARE:
        return "power"
    links = gpu.memory.get("nvlink")
    if links is not None and links.prev is not None and hw.nvlink_errors_per_s > 0:
        rate = nvlink_error_rate(links, hw.rate_window_s)
        if rate >= hw.nvlink_errors_per_s:
            return "nvlink_errors"
    return "unknown"


def _hardware_evidence(gpu: GpuView, reason: str, hw: HardwareConfig) -> list[str]:
    """The GPU's own account next to the peer comparison: reason bits, violation shares, NVLink rises."""
    out: list[str] = []
    if gpu.throttle:
        out.append("clock-event reasons: " + ", ".join(gpu.throttle))
    if gpu.violation_share:
        out.append(describe_violations(gpu.violation_share, gpu.violation_span_s))
    links = gpu.memory.get("nvlink")
    if reason == "nvlink_errors" and links is not None and links.prev is not None:
        rate = nvlink_error_rate(links, hw.rate_window_s)
        rose = f" ({', '.join(links.rose)})" if links.rose else ""
        out.append(f"NVLink errors at {rate:.1f}/s{rose}")
    return out


_ACTION: dict[str, Action] = {
    "thermal": "drain",
    "power": "drain",
    "nvlink_errors": "reset_gpu",
    "unknown": "none",
    "slow_host": "drain",
}


def straggler_hold_s(cfg: StragglerConfig) -> float:
    """How long after a restart the detector needs to judge again: its hosts' clock rates measured anew (a
    rank is judged by compute time only on a host whose clock rate is known), its moving averages, and
    ``persistence`` evaluations in a row."""
    return RATE_KNOWN_AFTER_S + cfg.ema_window_s + cfg.eval_interval_s * (cfg.persistence + 1)


def gpu_key(host: str, gpu: int) -> Key:
    return ("straggler", host, str(gpu))


def rank_key(job: str, rank: int) -> Key:
    return ("straggler", "rank", job, str(rank))


def host_key(host: str) -> Key:
    return ("straggler", "host", host, "*")


class StragglerDetector(Detector):
    """Owns every rank's step history and the candidates' streaks."""

    name = DETECTOR

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self.steps: dict[str, dict[int, RankSteps]] = {}
        self.heads_versions: dict[str, int] = {}
        #: job → rank → (its median, the job's median, steps, robust z) at the latest evaluation (every rank:
        #: kept as tuples, a RankJudgement is made only when asked for)
        self.judged: dict[str, dict[int, tuple[float, float, int, float]]] = {}
        self.streaks: dict[Key, Streak] = {}
        self.next_eval = -math.inf
        #: jobs restored from the store and not yet seen again, and until when they may come back
        self._restored: set[str] = set()
        self._restored_until: float | None = None
        self._restore_pending = False

    def evaluate(self, seen: Observation) -> Evaluation | None:
        return run_steps(self.evaluate_steps(seen))

    def evaluate_steps(self, seen: Observation) -> Steps[Evaluation | None]:
        """Sliced (a yield every :data:`ITEMS_PER_STEP` ranks or GPUs): folding the heads of large jobs and
        comparing every rank in one piece would make every batch behind it wait."""
        cfg = self.config.detect.straggler
        for job in list(seen.fleet.jobs.values()):
            yield from self._measure(job, cfg)
        self._forget_unclaimed(seen)
        if seen.now < self.next_eval:
            return None
        self.next_eval = seen.now + cfg.eval_interval_s
        findings = yield from self._judge(seen.fleet, seen.now)
        return Evaluation(findings)

    def job_ended(self, job: str) -> None:
        self.steps.pop(job, None)
        self.heads_versions.pop(job, None)
        self.judged.pop(job, None)

    def host_forgotten(self, host: str) -> None:
        """Its GPUs' and its host streaks go (rank histories are the job's and end with it)."""

        def about_host(key: Key, streak: Streak) -> bool:
            gpu = len(key) == 3 and key[1] == host  # gpu_key(host, n)
            return (
                gpu or key == host_key(host) or (streak.finding is not None and streak.finding.host == host)
            )

        self.streaks = {key: streak for key, streak in self.streaks.items() if not about_host(key, streak)}

    def rank_judgement(self, job: str, rank: int) -> RankJudgement | None:
        judged = self.judged.get(job, {}).get(rank)
        if judged is None:
            return None
        own, med, n, z = judged
        return RankJudgement(median_s=own, job_median_s=med, steps=n, z=z)

    def memory(self) -> StragglerMemory:
        """The step histories and streaks as structs, which the state store encodes directly: turning the
        histories of large jobs into builtins first would cost the event loop at every flush."""
        return run_steps(self.memory_steps())

    def memory_steps(self) -> Steps[StragglerMemory]:
        """:meth:`memory` copied a rank history at a time with a yield every :data:`ITEMS_PER_STEP` ranks
        (the state store prepares it ahead of a flush: in one piece, a fleet's histories hold the loop). Each
        rank's copy is whole; ranks folded meanwhile are copied as they are then (a warm start)."""
        steps: dict[str, dict[int, _RankMemory]] = {}
        copied = 0
        for job, ranks in list(self.steps.items()):
            kept = steps[job] = {}
            for rank, history in list(ranks.items()):
                kept[rank] = _RankMemory(history.last_seq, list(history.compute))
                copied += 1
                if copied % ITEMS_PER_STEP == 0:
                    yield
        return StragglerMemory(
            steps=steps, streaks=[_StreakMemory(k, s.hits, s.misses) for k, s in self.streaks.items()]
        )

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self.memory())
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Take back the step histories and streaks (a record of another shape is logged and dropped)."""
        try:
            memory = msgspec.convert(state, StragglerMemory, strict=False)
        except msgspec.ValidationError as exc:
            log().warning("straggler_memory_unreadable", error=str(exc)[:300])
            return
        window = self.config.detect.straggler.compute_window_steps
        self.steps = {
            job: {
                rank: RankSteps(last_seq=m.last_seq, compute=deque(m.compute[-window:], maxlen=window))
                for rank, m in ranks.items()
            }
            for job, ranks in memory.steps.items()
        }
        self.streaks = {s.key: Streak(hits=s.hits, misses=s.misses, restored=True) for s in memory.streaks}
        self._restored = set(self.steps)
        self._restore_pending = True

    def _forget_unclaimed(self, seen: Observation) -> None:
        """The restore hold: it starts at the first evaluation after a restore and lasts as long as the
        detector needs to judge again; restored jobs that have not come back by its end are over."""
        if self._restore_pending:
            self._restore_pending = False
            cfg = self.config.detect.straggler
            self._restored_until = seen.now + straggler_hold_s(cfg)
        if self._restored_until is None:
            return
        self._restored -= seen.fleet.jobs.keys()
        if seen.now >= self._restored_until:
            for job in self._restored:
                self.job_ended(job)
            self._restored = set()
            self._restored_until = None

    # -- measuring --------------------------------------------------------------------------------------

    def _measure(self, job: JobView, cfg: StragglerConfig) -> Steps[None]:
        """Fold new steps from the ranks' newest heads into their histories (steps dedup by seq)."""
        last = self.heads_versions.get(job.id)
        if last == job.heads_version:
            return
        self.heads_versions[job.id] = job.heads_version
        ranks = self.steps.setdefault(job.id, {})
        window = cfg.compute_window_steps
        log = job.heads_log
        new = job.heads_version - last if last is not None else None
        if new is not None and 0 < new <= len(log):  # only the ranks whose heads came since
            views = job.ranks
            for index, rank in enumerate(log[len(log) - new :]):
                view = views.get(rank)
                if view is not None:
                    self._fold(ranks, view, window)
                if index % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
                    yield
            return
        for index, view in enumerate(list(job.ranks.values())):
            self._fold(ranks, view, window)
            if index % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
                yield
        # a rank gone from the job is forgotten; one restored from the store and not heard from yet is kept
        for rank in [r for r, s in ranks.items() if r not in job.ranks and s.heads_at > -math.inf]:
            del ranks[rank]

    @staticmethod
    def _fold(ranks: dict[int, RankSteps], view: RankView, window: int) -> None:
        heads = view.heads
        if heads is None or not heads.steps:
            return
        steps = ranks.get(view.rank)
        if steps is None:
            steps = ranks[view.rank] = RankSteps(compute=deque(maxlen=window))
        elif steps.heads_at >= view.heads_at:
            return
        steps.heads_at = view.heads_at
        last_seq = steps.last_seq
        compute = steps.compute
        for step in heads.steps:
            if step.seq > last_seq:
                compute.append(step.compute_s)
                last_seq = step.seq
        steps.last_seq = last_seq

    # -- judging ----------------------------------------------------------------------------------------

    def _judge(self, fleet: FleetState, now: float) -> Steps[list[Finding]]:
        cfg = self.config.detect.straggler
        candidates = yield from _candidates_by_clock(fleet, cfg, self.config.detect.hardware)
        by_compute = yield from self._candidates_by_compute(fleet, cfg, now)
        for key, finding in by_compute.items():
            known = candidates.get(key)
            candidates[key] = finding if known is None else _merged(known, finding)
        candidates = _by_host(fleet, candidates, cfg)
        streaks = self.streaks
        for key, finding in candidates.items():
            streak = streaks.get(key)
            if streak is None:
                streak = streaks[key] = Streak()
            streak.hits += 1
            streak.misses = 0
            streak.finding = finding
            streak.restored = False
        rebuilding = self._restored_until is not None and now < self._restored_until
        for key in [k for k in streaks if k not in candidates]:
            streak = streaks[key]
            if streak.restored and rebuilding:
                continue
            streak.misses += 1
            if streak.hits < cfg.persistence or streak.misses >= cfg.persistence:
                del streaks[key]
        return [s.finding for s in streaks.values() if s.hits >= cfg.persistence and s.finding is not None]

    def _candidates_by_compute(
        self, fleet: FleetState, cfg: StragglerConfig, now: float
    ) -> Steps[dict[Key, Finding]]:
        out: dict[Key, Finding] = {}
        hw = self.config.detect.hardware
        fresh_s = self.config.detect.stuck.heads_fresh_s
        stalled_after = self.config.detect.stuck.min_wait_s
        self.judged = {}
        hosts = fleet.hosts
        max_error = cfg.max_clock_rate_error
        gated: dict[str, bool] = {}  # host → its clock is known to be within the gate (once per evaluation)
        recent = cfg.min_steps
        half = recent // 2
        counted = 0
        for job in list(fleet.jobs.values()):
            if now - job.last_progress_at >= stalled_after:
                continue  # a stalled job is the stuck detector's; its ranks compute nothing
            histories = self.steps.get(job.id, {})
            ranks = job.ranks
            # Two windows per rank: the last ``min_steps`` steps (a large slowdown also slows the job's steps,
            # so it must be seen within few of them) and all remembered steps (a small one needs more of them
            # to stand out of ±20% jitter). Each is compared with the same window of the other ranks. (The
            # medians are taken inline: this loop runs over every rank of every job each evaluation.)
            windows: tuple[dict[int, tuple[float, int]], dict[int, tuple[float, int]]] = ({}, {})
            last_window, all_window = windows
            for rank, steps in list(histories.items()):
                counted += 1
                if counted % ITEMS_PER_STEP == 0:
                    yield
                view = ranks.get(rank)
                if view is None or not view.alive or now - view.heads_at > fresh_s:
                    continue
                name = view.host
                if name is not None:
                    ok = gated.get(name)
                    if ok is None:
                        host = hosts.get(name)
                        ok = gated[name] = host is None or host.clock.rate_error() <= max_error
                    if not ok:
                        # its step times are in its clock's unit (or the unit is not measured yet, the first
                        # 20-30 s): neither judged nor part of the yardstick; the skew is the clock metric's
                        continue
                compute = steps.compute
                n = len(compute)
                if n >= recent:
                    ordered = sorted(compute)
                    mid = n // 2
                    all_window[rank] = (ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0, n)
                    last = sorted(islice(compute, n - recent, None))
                    last_window[rank] = (
                        last[half] if recent % 2 else (last[half - 1] + last[half]) / 2.0,
                        recent,
                    )
            if len(all_window) < cfg.min_peers:
                continue
            judged = self.judged[job.id] = {}
            flagged: dict[int, RankJudgement] = {}
            hosts_compared = 0  # distinct hosts of the ranks compared (the flagged rank's among them)
            for index, medians in enumerate(windows):
                # each host one vote: a host reporting many ranks moves the job's median by one host at most
                values = [m for m, _ in medians.values()]
                owners = [ranks[r].host if r in ranks else None for r in medians]
                yield
                med, mad, distinct = host_median_mad(values, owners)
                yield
                hosts_compared = max(hosts_compared, distinct)
                if med <= 0:
                    continue
                scale = max(MAD_SCALE * mad, _MIN_SCALE_FRACTION * med)
                for position, (rank, (own, n)) in enumerate(medians.items()):
                    if position % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
                        yield
                    z = (own - med) / scale
                    if index == 1:
                        judged[rank] = (own, med, n, z)
                    if own / med - 1.0 >= cfg.min_slowdown and z >= cfg.compute_z_threshold:
                        flagged[rank] = RankJudgement(median_s=own, job_median_s=med, steps=n, z=z)
            for rank, judgement in flagged.items():
                own, med, n, z = judgement.median_s, judgement.job_median_s, judgement.steps, judgement.z
                view = job.ranks.get(rank)
                if view is None:  # left the job while the comparison was sliced
                    continue
                gpu = fleet.gpu(view.host, view.gpu) if view.host is not None else None
                reason = _reason(gpu, hw)
                evidence = [
                    f"rank {rank} computes {own * 1000:.0f} ms per step vs {med * 1000:.0f} ms for the median "
                    f"of {len(windows[1])} ranks ({own / med:.2f}x, {(own - med) * 1000:.0f} ms late per step, "
                    f"robust z {z:.1f}; medians of each rank's last {n} steps)"
                ]
                if gpu is not None:
                    evidence += _hardware_evidence(gpu, reason, hw)
                if gpu is None:
                    evidence.append("its GPU is unknown (no NVML process mapping): judged by rank")
                elif reason == "unknown":
                    evidence.append(
                        "no thermal, power or NVLink cause on its GPU: slow compute, input or host"
                    )
                key = gpu_key(view.host, view.gpu) if view.host is not None and view.gpu is not None else None
                key = key or rank_key(job.id, rank)
                out[key] = Finding(
                    key=key,
                    detector=DETECTOR,
                    kind="straggler",
                    reason=reason,
                    action=_ACTION[reason],
                    evidence=tuple(evidence),
                    evidence_t=now,
                    host=view.host,
                    gpu=view.gpu,
                    job=job.id,
                    rank=rank,
                    learned_from=hosts_compared - 1,
                )
        return out


def _merged(known: Finding, finding: Finding) -> Finding:
    return Finding(
        key=known.key,
        detector=DETECTOR,
        kind="straggler",
        reason=known.reason,
        action=known.action,
        # both findings cite the GPU's hardware (reason bits, violation time): keep each line once, in order
        evidence=tuple(dict.fromkeys(known.evidence + finding.evidence)),
        evidence_t=known.evidence_t,
        host=known.host,
        gpu=known.gpu,
        job=finding.job,
        rank=finding.rank,
        learned_from=_stronger(known.learned_from, finding.learned_from),
    )


def _stronger(*backings: int | None) -> int | None:
    """The backing of findings merged into one: the strongest (None, not learned, is the strongest)."""
    if any(b is None for b in backings):
        return None
    return max(b for b in backings if b is not None)


def _by_host(fleet: FleetState, candidates: dict[Key, Finding], cfg: StragglerConfig) -> dict[Key, Finding]:
    """Most GPUs of one host slow together: one host verdict replaces theirs."""
    per_host: dict[str, list[Finding]] = {}
    for finding in candidates.values():
        if finding.host is not None:
            per_host.setdefault(finding.host, []).append(finding)
    for host_name, found in per_host.items():
        host = fleet.hosts.get(host_name)
        size = len(host.gpus) if host is not None else 0
        size = max(size, len({f.gpu if f.gpu is not None else f"r{f.rank}" for f in found}))
        if len(found) < 2 or len(found) < cfg.host_share * size:
            continue
        found.sort(key=lambda f: (f.gpu if f.gpu is not None else -1, f.rank if f.rank is not None else -1))
        reasons = {f.reason for f in found}
        reason = reasons.pop() if len(reasons) == 1 and "unknown" not in reasons else "slow_host"
        names = ", ".join(
            f"GPU {f.gpu}" + (f" (rank {f.rank})" if f.rank is not None else "")
            if f.gpu is not None
            else f"rank {f.rank}"
            for f in found[:16]
        )
        jobs = sorted({f.job for f in found if f.job is not None})
        evidence = (
            f"{len(found)} of {size} GPUs of {host_name} are slow together ({names}): the host, not one GPU "
            "(cooling, CPU, PCIe or power)",
            *found[0].evidence[:3],
        )
        for f in found:
            del candidates[f.key]
        key = host_key(host_name)
        candidates[key] = Finding(
            key=key,
            detector=DETECTOR,
            kind="straggler",
            reason=reason,
            action=_ACTION.get(reason, "drain"),
            evidence=evidence,
            evidence_t=min(f.evidence_t for f in found),
            host=host_name,
            job=jobs[0] if len(jobs) == 1 else None,
            learned_from=_stronger(*(f.learned_from for f in found)),
        )
    return candidates


def _candidates_by_clock(
    fleet: FleetState, cfg: StragglerConfig, hw: HardwareConfig
) -> Steps[dict[Key, Finding]]:
    groups: dict[str, list[GpuView]] = {}
    for index, host in enumerate(list(fleet.hosts.values())):
        if index % (ITEMS_PER_STEP // 4) == ITEMS_PER_STEP // 4 - 1:
            yield  # (a host's GPUs each)
        for gpu in host.gpus:
            if (
                gpu.state == "ok"
                and gpu.ema_clock is not None
                and gpu.ema_util is not None
                and gpu.ema_util >= 50
                and "gpu_idle" not in gpu.throttle
            ):
                groups.setdefault(gpu.name, []).append(gpu)
    out: dict[Key, Finding] = {}
    for name, gpus in groups.items():
        if len(gpus) < cfg.min_peers:
            continue
        clocks = [g.ema_clock for g in gpus if g.ema_clock is not None]
        busy_hosts = [g.host for g in gpus if g.ema_clock is not None]
        yield
        med, mad, hosts = host_median_mad(clocks, busy_hosts)
        yield  # (each median below sorts every busy GPU's readings: a step each)
        if med <= 0 or hosts < cfg.min_hosts:
            continue
        scale = max(MAD_SCALE * mad, 0.002 * med)
        temps = [g.ema_temp for g in gpus if g.ema_temp is not None]
        med_temp = median(temps) if temps else None
        yield
        powers = [g.ema_power for g in gpus if g.ema_power is not None]
        med_power = median(powers) if powers else None
        yield
        for index, gpu in enumerate(gpus):
            if index % ITEMS_PER_STEP == ITEMS_PER_STEP - 1:
                yield
            clock = gpu.ema_clock
            if clock is None:  # its readings went while the comparison was sliced
                continue
            drop = (med - clock) / med
            z = (med - clock) / scale
            if drop < cfg.min_clock_drop or z < cfg.z_threshold:
                continue
            reason = _reason(gpu, hw)
            evidence = [
                f"SM clock {clock:.0f} MHz vs {med:.0f} MHz median of {len(gpus)} busy {name or 'GPUs'} "
                f"on {hosts} hosts, one vote per host ({drop:.0%} lower, robust z {z:.1f})"
            ]
            if gpu.ema_temp is not None and med_temp is not None:
                evidence.append(f"temperature {gpu.ema_temp:.0f} °C vs {med_temp:.0f} °C median")
            if gpu.ema_power is not None and med_power is not None:
                evidence.append(f"power {gpu.ema_power:.0f} W vs {med_power:.0f} W median")
            evidence += _hardware_evidence(gpu, reason, hw)
            key = gpu_key(gpu.host, gpu.index)
            out[key] = Finding(
                key=key,
                detector=DETECTOR,
                kind="straggler",
                reason=reason,
                action=_ACTION[reason],
                evidence=tuple(evidence),
                evidence_t=gpu.t,
                host=gpu.host,
                gpu=gpu.index,
                job=gpu.job,
                rank=gpu.rank,
                learned_from=hosts - 1,  # the other hosts whose GPUs make the median
            )
    return out

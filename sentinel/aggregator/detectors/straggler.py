"""Straggler detector: the GPU or rank that is slower than its peers, and why.

Two robust peer comparisons (median and MAD, so one sick GPU does not move the yardstick):

- across identical busy GPUs of the fleet: the moving average of the SM clock, with temperature, power and
  the throttle reasons telling thermal from power from unknown;
- inside a job: how late each rank enters its collectives compared with the first member to enter
  (measured from the flight-recorder heads, and only while the rank is computing — a rank late because it
  waits in another group is a victim, not a straggler).

A GPU must stand out in ``persistence`` consecutive evaluations before a verdict opens and must stop
standing out as many times before it closes, so one noisy sample neither opens nor flaps a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from sentinel.aggregator.state import FleetState, GpuView, JobView
from sentinel.aggregator.verdicts import Finding
from sentinel.config.aggregator import StragglerConfig

DETECTOR = "straggler"
_MAD_SCALE = 1.4826
_ALPHA = 0.2
MIN_LATENESS_SAMPLES = 3


@dataclass(slots=True)
class Streak:
    hits: int = 0
    misses: int = 0
    finding: Finding | None = None


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def median_mad(values: list[float]) -> tuple[float, float]:
    med = median(values)
    return med, median([abs(v - med) for v in values])


def measure_lateness(job: JobView, now: float, fresh_s: float) -> None:
    """Fold the newest heads of ``job`` into each rank's collective-entry lateness average."""
    live = [
        view
        for view in job.ranks.values()
        if view.heads is not None and view.alive and now - view.heads_at <= fresh_s
    ]
    earliest: dict[tuple[str, int], float] = {}
    for view in live:
        heads = view.heads
        assert heads is not None
        for pg in heads.pgs:
            for flight in pg.in_flight:
                if flight.p2p:
                    continue
                key = (pg.pg_name, flight.seq)
                entry = heads.t - flight.age_s
                known = earliest.get(key)
                if known is None or entry < known:
                    earliest[key] = entry
    if not earliest:
        return
    for view in live:
        heads = view.heads
        assert heads is not None
        if heads.t <= view.measured_t:
            continue
        view.measured_t = heads.t
        busy = False
        for pg in heads.pgs:
            if pg.in_flight:
                busy = True
                break
        sample: float | None = None
        censored = False
        for pg in heads.pgs:
            current = pg.last_completed_seq + 1
            first = earliest.get((pg.pg_name, current))
            if first is None:
                continue
            late: float | None = None
            bound = False
            if pg.last_enqueued_seq >= current:
                for flight in pg.in_flight:
                    if flight.seq == current:
                        late = heads.t - flight.age_s - first
                        break
            elif not busy and heads.t > first:
                late, bound = heads.t - first, True
            if late is not None and (sample is None or late > sample):
                sample, censored = max(0.0, late), bound
        if sample is None:
            continue
        if censored and view.late_n and sample <= view.late_ema:
            # The rank has not entered yet: the sample is only a lower bound on its lag. A bound below
            # the estimate says nothing; averaging it in would pull a slow rank's estimate towards half
            # its true lag (it is mostly seen mid-compute, rarely inside the collective it completes last).
            continue
        view.late_ema += _ALPHA * (sample - view.late_ema) if view.late_n else sample - view.late_ema
        view.late_n += 1


def _reason(gpu: GpuView | None) -> str:
    if gpu is None:
        return "unknown"
    if gpu.ema_thermal >= 0.5:
        return "thermal"
    if gpu.ema_power_cap >= 0.5:
        return "power"
    return "unknown"


_ACTION = {"thermal": "drain", "power": "drain", "unknown": "none"}


def _candidates_by_clock(fleet: FleetState, cfg: StragglerConfig) -> dict[tuple[str, ...], Finding]:
    groups: dict[str, list[GpuView]] = {}
    for host in fleet.hosts.values():
        for gpu in host.gpus:
            if (
                gpu.state == "ok"
                and gpu.ema_clock is not None
                and gpu.ema_util is not None
                and gpu.ema_util >= 50
                and "gpu_idle" not in gpu.throttle
            ):
                groups.setdefault(gpu.name, []).append(gpu)
    out: dict[tuple[str, ...], Finding] = {}
    for name, gpus in groups.items():
        if len(gpus) < cfg.min_peers:
            continue
        clocks = [g.ema_clock for g in gpus if g.ema_clock is not None]
        med, mad = median_mad(clocks)
        if med <= 0:
            continue
        scale = max(_MAD_SCALE * mad, 0.002 * med)
        temps = [g.ema_temp for g in gpus if g.ema_temp is not None]
        powers = [g.ema_power for g in gpus if g.ema_power is not None]
        med_temp = median(temps) if temps else None
        med_power = median(powers) if powers else None
        for gpu in gpus:
            clock = gpu.ema_clock
            assert clock is not None
            drop = (med - clock) / med
            z = (med - clock) / scale
            if drop < cfg.min_clock_drop or z < cfg.z_threshold:
                continue
            reason = _reason(gpu)
            evidence = [
                f"SM clock {clock:.0f} MHz vs {med:.0f} MHz median of {len(gpus)} busy {name or 'GPUs'} "
                f"({drop:.0%} lower, robust z {z:.1f})"
            ]
            if gpu.ema_temp is not None and med_temp is not None:
                evidence.append(f"temperature {gpu.ema_temp:.0f} °C vs {med_temp:.0f} °C median")
            if gpu.ema_power is not None and med_power is not None:
                evidence.append(f"power {gpu.ema_power:.0f} W vs {med_power:.0f} W median")
            if gpu.throttle:
                evidence.append("clock-event reasons: " + ", ".join(gpu.throttle))
            key = ("straggler", gpu.host, str(gpu.index))
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
            )
    return out


def _candidates_by_lag(
    fleet: FleetState, cfg: StragglerConfig, skip_jobs: set[str], now: float
) -> dict[tuple[str, ...], Finding]:
    out: dict[tuple[str, ...], Finding] = {}
    for job in fleet.jobs.values():
        if job.id in skip_jobs:
            continue
        views = [v for v in job.ranks.values() if v.alive and v.late_n >= MIN_LATENESS_SAMPLES]
        if len(views) < cfg.min_peers:
            continue
        med, mad = median_mad([v.late_ema for v in views])
        scale = max(_MAD_SCALE * mad, 0.01)
        step = job.step_s or 0.0
        floor = max(cfg.min_lag_s, cfg.min_lag_fraction * step)
        for view in views:
            lag = view.late_ema - med
            if lag < floor or lag / scale < cfg.z_threshold or view.host is None or view.gpu is None:
                continue
            gpu = fleet.gpu(view.host, view.gpu)
            reason = _reason(gpu)
            evidence = [
                f"rank {view.rank} enters its collectives {lag * 1000:.0f} ms after the first peer, "
                f"median rank {med * 1000:.0f} ms (step {step:.2f}s, {len(views)} ranks)"
            ]
            if gpu is not None and gpu.throttle:
                evidence.append("clock-event reasons: " + ", ".join(gpu.throttle))
            if reason == "unknown":
                evidence.append("no thermal or power clock event on its GPU: slow compute, input or host")
            key = ("straggler", view.host, str(view.gpu))
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
                rank=view.rank,
            )
    return out


def evaluate(
    fleet: FleetState,
    cfg: StragglerConfig,
    now: float,
    streaks: dict[tuple[str, ...], Streak],
    stalled_jobs: set[str],
) -> list[Finding]:
    """Findings that have persisted; ``streaks`` is this detector's memory between evaluations."""
    candidates = _candidates_by_clock(fleet, cfg)
    for key, finding in _candidates_by_lag(fleet, cfg, stalled_jobs, now).items():
        known = candidates.get(key)
        if known is None:
            candidates[key] = finding
        else:
            candidates[key] = Finding(
                key=key,
                detector=DETECTOR,
                kind="straggler",
                reason=known.reason,
                action=known.action,
                evidence=known.evidence + finding.evidence,
                evidence_t=known.evidence_t,
                host=known.host,
                gpu=known.gpu,
                job=finding.job,
                rank=finding.rank,
            )
    for key, finding in candidates.items():
        streak = streaks.get(key)
        if streak is None:
            streak = streaks[key] = Streak()
        streak.hits += 1
        streak.misses = 0
        streak.finding = finding
    for key in [k for k in streaks if k not in candidates]:
        streak = streaks[key]
        streak.misses += 1
        if streak.hits < cfg.persistence or streak.misses >= cfg.persistence:
            del streaks[key]
    return [s.finding for s in streaks.values() if s.hits >= cfg.persistence and s.finding is not None]

"""JSON views of fleet state for the REST API and the status page (plain dicts, no I/O)."""

from __future__ import annotations

from typing import Any

from sentinel.aggregator.detectors.link_pace import LinkPaceDetector
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.state import HostView, JobView
from sentinel.components.gpu_view import GpuView

_HEALTH_ORDER = {"healthy": 0, "straggler": 1, "stuck": 2, "degraded": 3, "faulty": 4, "lost": 5}


def gpu_health(engine: Engine) -> dict[tuple[str, int], str]:
    """Worst open verdict per GPU (GPUs absent are healthy unless NVML says otherwise)."""
    worst: dict[tuple[str, int], str] = {}
    for v in engine.book.open.values():
        if v.host is None or v.gpu is None or v.kind not in _HEALTH_ORDER:
            continue
        key = (v.host, v.gpu)
        known = worst.get(key)
        if known is None or _HEALTH_ORDER[v.kind] > _HEALTH_ORDER[known]:
            worst[key] = v.kind
    return worst


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def gpu_dict(gpu: GpuView, health: str) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "pci_bus": gpu.pci_bus,
        "name": gpu.name,
        "state": gpu.state,
        "health": "lost" if gpu.state != "ok" else health,
        "util_pct": _r(gpu.util),
        "temp_c": _r(gpu.temp),
        "power_w": _r(gpu.power),
        "sm_clock_mhz": _r(gpu.sm_clock, 0),
        "throttle": list(gpu.throttle),
        "job": gpu.job,
        "rank": gpu.rank,
        "t": gpu.t if gpu.t > 0 else None,
    }


def host_dict(
    engine: Engine, host: HostView, now: float, health: dict[tuple[str, int], str] | None = None
) -> dict[str, Any]:
    health = health if health is not None else gpu_health(engine)
    silent = now - host.last_seen
    return {
        "name": host.name,
        "cluster": host.cluster,
        "connected": host.connected,
        "last_seen": host.last_seen if host.last_seen > 0 else None,
        "silent_s": round(silent, 1) if host.last_seen > float("-inf") else None,
        "batches": host.batches,
        "duplicates": host.duplicates,
        # the host's clock against the aggregator's (None until measured): skew is reported, not judged
        "clock_rate": _r(host.clock.rate, 4),
        "clock_offset_s": _r(host.clock.offset_s, 3),
        "gpus": [gpu_dict(g, health.get((host.name, g.index), "healthy")) for g in host.gpus],
    }


MAX_HOST_NAMES = 1024


def job_summary(engine: Engine, job: JobView) -> dict[str, Any]:
    stall = engine.stalls.get(job.id)
    hosts = sorted({r.host for r in job.ranks.values() if r.host})
    return {
        "id": job.id,
        "world_size": job.world_size,
        "ranks": len(job.ranks),
        "hosts": len(hosts),
        "host_names": hosts[:MAX_HOST_NAMES],  # the status page's search finds a job by its hosts
        "stalled": stall is not None,
        "step_s": _r(job.step_s, 3),
        "last_progress_at": job.last_progress_at if job.last_progress_at > float("-inf") else None,
        "open_verdicts": sum(1 for v in engine.book.open.values() if v.job == job.id),
        "debug_readiness": _readiness(job),
        "nccl_ras": _ras(job),
        "stall": None
        if stall is None
        else {
            "pg": stall.pg,
            "seq": stall.seq,
            "op": stall.op,
            "waited_s": round(stall.waited_s, 1),
            "waiting": len(stall.waiting),
            "culprits": stall.culprits,
            "fr_outcome": stall.fr_outcome,
        },
    }


def _readiness(job: JobView) -> dict[str, Any] | None:
    """NCCL/PyTorch async-debug readiness over the job's hosts: a setting is missing when any host lacks it."""
    if not job.debug:
        return None
    missing: dict[str, list[str]] = {}
    for host, readiness in sorted(job.debug.items()):
        for name in readiness.missing:
            missing.setdefault(name, []).append(host)
    return {
        "ready": not missing,
        "missing": sorted(missing),
        "hosts_reported": len(job.debug),
        "missing_on": {name: hosts[:MAX_HOST_NAMES] for name, hosts in sorted(missing.items())},
    }


def _ras(job: JobView) -> dict[str, Any] | None:
    status = job.ras
    if status is None:
        return None
    return {
        "t": status.t,
        "healthy": status.healthy,
        "nccl_version": status.nccl_version,
        "missing_processes": status.missing_process_count,
        "dead_processes": status.dead_process_count,
        "communicator_issues": [f"{c.comm} {c.kind}" for c in status.comms[:16]],
    }


def _compute(engine: Engine, job: str, rank: int) -> dict[str, Any]:
    """The straggler detector's view of a rank: its median compute per step and how late that makes it."""
    judged = engine.rank_judgement(job, rank)
    if judged is None:
        return {"compute_ms": None, "lateness_ms": None, "slowdown": None}
    return {
        "compute_ms": round(judged.median_s * 1000, 1),
        "lateness_ms": round((judged.median_s - judged.job_median_s) * 1000, 1),
        "slowdown": round(judged.slowdown, 3),
    }


def _pace(engine: Engine, job: str) -> dict[str, Any] | None:
    """The link-pace detector's measure of the job: step time against its own baseline, and compute."""
    detector = engine.detectors.get(LinkPaceDetector.name)
    pace = detector.latest.get(job) if isinstance(detector, LinkPaceDetector) else None
    if pace is None:
        return None

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    share = pace.comm_share
    return {
        "step_ms": ms(pace.step_s),
        "baseline_step_ms": ms(pace.baseline_step_s),
        "slowdown": round(pace.slowdown, 3),
        "compute_ms": ms(pace.compute_s),
        "baseline_compute_ms": ms(pace.baseline_compute_s),
        "comm_share_of_extra": None if share is None else round(share, 3),
    }


def job_detail(engine: Engine, job: JobView, now: float) -> dict[str, Any]:
    out = job_summary(engine, job)
    out["pace"] = _pace(engine, job.id)
    ranks = []
    for rank in sorted(job.ranks):
        view = job.ranks[rank]
        heads = view.heads
        pgs = []
        if heads is not None:
            for pg in heads.pgs:
                pgs.append(
                    {
                        "pg": pg.pg_name,
                        "desc": pg.pg_desc,
                        "enqueued": pg.last_enqueued_seq,
                        "completed": pg.last_completed_seq,
                        "in_flight": [
                            {"seq": f.seq, "op": f.op, "age_s": round(f.age_s, 2)}
                            | ({"unconfirmed": True} if f.unconfirmed else {})  # not yet known pending
                            for f in pg.in_flight
                        ],
                    }
                )
        ranks.append(
            {
                "rank": rank,
                "host": view.host,
                "gpu": view.gpu,
                "pid": view.pid,
                "alive": view.alive,
                "heads_age_s": round(now - view.heads_at, 1) if heads is not None else None,
                **_compute(engine, job.id, rank),
                "pgs": pgs,
            }
        )
    out["rank_list"] = ranks
    out["verdicts"] = [v.to_dict() for v in engine.book.open.values() if v.job == job.id]
    return out

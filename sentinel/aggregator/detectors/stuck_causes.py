"""What the stuck detector concludes from an examined stall: the culprits with their hosts, GPUs and
evidence as they are now, or, when every rank is inside the stalled operation, the transport's culprit.

A rank whose heads stopped, an IB/RoCE port on one of the job's hosts (:mod:`sentinel.components.ib.causes`),
NCCL NET errors or NVLink error rates name the cause; without heads, PyTorch watchdog timeouts say who
waited. NCCL RAS's view of the job and a culprit in uninterruptible sleep (an I/O hang) are evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sentinel.aggregator.detectors.stuck_heads import (
    DETECTOR,
    Examination,
    Stall,
    _Rank,
    _ranks_summary,
)
from sentinel.aggregator.state import FleetState, JobView, RankView
from sentinel.aggregator.verdicts import Finding
from sentinel.components import registry
from sentinel.components.gpu_view import GpuView
from sentinel.components.ib.causes import stall_causes
from sentinel.components.ib.rule import PortRuleConfig
from sentinel.components.linkpace.rule import LinkPaceConfig
from sentinel.components.nvlink.signal import error_rate as nvlink_error_rate
from sentinel.components.vocab import Action
from sentinel.config.aggregator import HardwareConfig, StuckConfig
from sentinel.fr.ops import op_name


def conclude(  # noqa: PLR0917
    exam: Examination,
    job: JobView,
    fleet: FleetState,
    cfg: StuckConfig,
    hw: HardwareConfig,
    now: float,
    ports: PortRuleConfig,
    *,
    links: LinkPaceConfig | None = None,
) -> tuple[list[Finding], Stall | None]:
    """The findings of an examined job at ``now``: its culprits with their hosts, GPUs and evidence as
    they are now (NCCL RAS's view of the job added), or, when every rank entered the stalled collective,
    the transport's culprit."""
    if exam.first is None:
        return [], None
    ranks = exam.ranks
    findings: list[Finding] = []
    op, since, waiting = exam.stalled[exam.first]
    stall = Stall(
        job=job.id, pg=exam.first[0], seq=exam.first[1], op=op, waited_s=now - since, waiting=sorted(waiting)
    )
    evidence_t = since
    if exam.culprits:
        for rank in sorted(exam.culprits)[: cfg.max_culprits]:
            reason, lines = exam.culprits[rank]
            trail = [line(now) for line in lines]
            named = job.ranks.get(rank)
            host = named.host if named is not None else None
            gpu = named.gpu if named is not None else None
            evidence = [*trail, *_corroborate(fleet, host, gpu, waiting, ranks)]
            if exam.blind_p2p and len(exam.culprits) > 1:
                evidence.append(
                    "the job's collectives run on gloo, whose send/recv never show in the heads: one of these "
                    "culprits may be blocked in a send/recv to another rather than stuck itself (the heads "
                    "cannot say which)"
                )
            action: Action = "restart_app"
            if reason in ("not_entered_collective", "rank_gone"):
                io = _io_hang(fleet, named)
                if io is not None:
                    reason, action = "io_hang", "drain"
                    evidence.insert(len(trail) - 1, io)
            findings.append(
                Finding(
                    key=("stuck", job.id, str(rank)),
                    detector=DETECTOR,
                    kind="stuck",
                    reason=reason,
                    action=action,
                    evidence=tuple(evidence),
                    evidence_t=evidence_t,
                    host=host,
                    gpu=gpu,
                    job=job.id,
                    rank=rank,
                )
            )
        stall.culprits = sorted(exam.culprits)
        return _with_stall_evidence(job, cfg, now, findings), stall
    if exam.p2p_only:
        findings = _p2p_unexplained(job, fleet, cfg, hw, now, exam, ports, links=links)
    for pg_name, seq in exam.all_in:
        op_in, since_in, waiting_in = exam.stalled[(pg_name, seq)]
        findings.extend(
            _all_entered(
                job,
                fleet,
                cfg,
                hw,
                now,
                pg_name,
                seq,
                (op_in, now - since_in, waiting_in),
                ranks,
                ports,
                links=links,
            )
        )
        if findings:
            break
    stall.culprits = sorted({f.rank for f in findings if f.rank is not None})
    return _with_stall_evidence(job, cfg, now, findings), stall


#: the signals that add evidence to a stall's verdict (NCCL RAS), in registry order
STALL_EVIDENCE = tuple(s.stall_evidence for s in registry.SIGNALS if s.stall_evidence is not None)


def _with_stall_evidence(
    job: JobView, cfg: StuckConfig, now: float, findings: list[Finding]
) -> list[Finding]:
    extra = [line for evidence in STALL_EVIDENCE for line in evidence(job, cfg, now)] if findings else []
    if extra:
        return [replace(f, evidence=(*f.evidence, *extra)) for f in findings]
    return findings


def _io_hang(fleet: FleetState, view: RankView | None) -> str | None:
    """Evidence that the culprit's process sits in uninterruptible sleep (``D``): a hung network filesystem
    or device I/O, not a GPU or network fault. The agent reports each GPU process's state every tick."""
    if view is None or view.host is None or view.pid is None:
        return None
    host = fleet.hosts.get(view.host)
    if host is None:
        return None
    for proc in host.procs:
        if proc.pid == view.pid and proc.blocked_io:
            return (
                f"rank {view.rank}'s process {view.pid} on {view.host} is in uninterruptible sleep (D in "
                "/proc/PID/stat): an I/O hang (network filesystem, storage), not a GPU or network fault"
            )
    return None


def _corroborate(
    fleet: FleetState, host: str | None, gpu: int | None, waiting: list[int], ranks: dict[int, _Rank]
) -> list[str]:
    view = fleet.gpu(host, gpu) if host is not None else None
    if view is None:
        return []
    if view.state != "ok":
        return [f"its GPU {host}/{gpu} is {view.state}"]
    peer_utils = []
    for rank in waiting[:64]:
        info = ranks.get(rank)
        if info is None:
            continue
        peer = fleet.gpu(info.view.host or "", info.view.gpu)
        if peer is not None and peer.util is not None:
            peer_utils.append(peer.util)
    if view.util is None or not peer_utils:
        return []
    peer_utils.sort()
    median = peer_utils[len(peer_utils) // 2]
    if view.util < 20 <= median:
        return [
            f"its GPU {host}/{gpu} idles (util {view.util:.0f}%) while waiting peers spin (util {median:.0f}%)"
        ]
    return [f"its GPU {host}/{gpu} util {view.util:.0f}%, waiting peers {median:.0f}%"]


def _all_entered(  # noqa: PLR0917
    job: JobView,
    fleet: FleetState,
    cfg: StuckConfig,
    hw: HardwareConfig,
    now: float,
    pg_name: str,
    seq: int,
    stalled: tuple[str, float, list[int]],
    ranks: dict[int, _Rank],
    ports: PortRuleConfig,
    *,
    links: LinkPaceConfig | None = None,
) -> list[Finding]:
    op, age, waiting = stalled
    head = f"all {len(waiting)} rank(s) are inside {op} (pg {pg_name}, seq {seq}) for {age:.1f}s and none completes"
    members = [info for info in ranks.values() if pg_name in info.pgs]
    last = ("collective_stalled", "no rank, NCCL or NVLink evidence names a culprit")
    return _unexplained(job, fleet, cfg, hw, now, ports, head, age, members, last, links=links)


def _p2p_unexplained(  # noqa: PLR0917
    job: JobView,
    fleet: FleetState,
    cfg: StuckConfig,
    hw: HardwareConfig,
    now: float,
    exam: Examination,
    ports: PortRuleConfig,
    *,
    links: LinkPaceConfig | None = None,
) -> list[Finding]:
    """Every stalled rank is blocked in a send/recv and no rank can be blamed: each pending op's counterpart
    was posted (a transfer that does not complete) or its peer sits inside a collective (the heads hold no
    history to tell its counterpart from a transfer its batch holds open). Judged like a collective every
    member entered — the ranks' heads, then the network, NCCL and NVLink — and, with none of them, an
    inconclusive ``p2p_stalled`` verdict that shows the blocked ops instead of silence."""
    held = exam.p2p_only
    age = now - held[0][4]
    blocked = [h[0] for h in held]
    head = (
        f"all {len(held)} stalled rank(s) ({_ranks_summary(blocked)}) are blocked in send/recv, the longest for "
        f"{age:.1f}s, and none completes; no collective is stalled"
    )
    involved = set(blocked) | {h[5] for h in held}
    members = [info for rank, info in exam.ranks.items() if rank in involved]
    ops = []
    for rank, pg_name, seq, op, _since, peer in held[:4]:
        other = exam.ranks.get(peer)
        state = (
            "inside a collective"
            if other is not None and other.waits
            else "posted the counterpart"
            if other is not None
            else "sent no heads"
        )
        ops.append(f"rank {rank} in {op_name(op)} (pg {pg_name}, p2p #{seq}) with rank {peer}, which {state}")
    last = (
        "p2p_stalled",
        "inconclusive: all ranks blocked in send/recv and no rank, NCCL or NVLink evidence names a culprit (every "
        "pending op's counterpart is posted, or its peer is inside a collective)",
        *ops,
    )
    return _unexplained(job, fleet, cfg, hw, now, ports, head, age, members, last, links=links)


def _unexplained(  # noqa: PLR0917
    job: JobView,
    fleet: FleetState,
    cfg: StuckConfig,
    hw: HardwareConfig,
    now: float,
    ports: PortRuleConfig,
    head: str,
    age: float,
    members: list[_Rank],
    last: tuple[str, ...],
    *,
    links: LinkPaceConfig | None = None,
) -> list[Finding]:
    """Ranks that all wait inside operations their peers entered: a rank whose heads stopped, a network
    port, NCCL NET errors or NVLink errors name the cause; with none, ``last`` (reason, why, more evidence)
    once the wait reaches ``unexplained_wait_s``."""
    evidence_t = now - age

    def finding(  # noqa: PLR0917
        reason: str,
        action: Action,
        view: RankView | None,
        host: str | None,
        gpu: int | None,
        why: str,
        *more: str,
    ) -> Finding:
        rank = view.rank if view is not None else None
        key = ("stuck", job.id, str(rank)) if rank is not None else ("stuck", job.id, f"host:{host}")
        return Finding(
            key=key,
            detector=DETECTOR,
            kind="stuck",
            reason=reason,
            action=action,
            evidence=(head, why, *more),
            evidence_t=evidence_t,
            host=host,
            gpu=gpu,
            job=job.id,
            rank=rank,
        )

    out: list[Finding] = []
    gone = [info for info in members if not info.fresh]
    for info in gone[: cfg.max_culprits]:
        view = info.view
        why = f"rank {view.rank}'s heads stopped {now - view.heads_at:.0f}s ago while its peers wait"
        out.append(finding("rank_gone", "restart_app", view, view.host, view.gpu, why))
    if out:
        return out
    by_host: dict[str, list[RankView]] = {}
    for info in members:
        if info.view.host is not None:
            by_host.setdefault(info.view.host, []).append(info.view)
    out.extend(_network_cause(job, fleet, cfg, ports, now, by_host, finding, links=links))
    if out:
        return out[: cfg.max_culprits]
    for host_name, views in sorted(by_host.items()):
        host = fleet.hosts.get(host_name)
        if host is None:
            continue
        net = [
            e for e in host.events if e.kind == "nccl_warn_net" and now - e.seen_at <= cfg.net_error_window_s
        ]
        if not net:
            continue
        gpus = {e.gpu for e in net}
        named = [v for v in views if v.gpu in gpus]
        sample = net[-1].text[:200]
        if named:
            for view in named[: cfg.max_culprits]:
                why = (
                    f"{len(net)} NCCL NET error(s) on {host_name} GPU {view.gpu} (rank {view.rank}): {sample}"
                )
                out.append(finding("nccl_net_error", "drain", view, host_name, view.gpu, why))
        else:
            out.append(
                finding(
                    "nccl_net_error",
                    "drain",
                    None,
                    host_name,
                    None,
                    f"{len(net)} NCCL NET error(s) on {host_name}: {sample}",
                )
            )
    if out:
        return out
    for info in members:
        view = info.view
        gpu = fleet.gpu(view.host or "", view.gpu)
        links = gpu.memory.get("nvlink") if gpu is not None else None
        if links is None or links.prev is None:
            continue
        rate = nvlink_error_rate(links, hw.rate_window_s)
        if rate >= hw.nvlink_errors_per_s:
            out.append(
                finding(
                    "nvlink_errors",
                    "reset_gpu",
                    view,
                    view.host,
                    view.gpu,
                    f"NVLink errors at {rate:.1f}/s on {view.host}/{view.gpu}"
                    + (f" ({', '.join(links.rose)})" if links.rose else ""),
                )
            )
    if out:
        return out[: cfg.max_culprits]
    if age < cfg.unexplained_wait_s:
        return []
    reason, why, *more = last
    return [finding(reason, "restart_app", None, None, None, why, *more)]


def _network_cause(  # noqa: PLR0917
    job: JobView,
    fleet: FleetState,
    cfg: StuckConfig,
    ports: PortRuleConfig,
    now: float,
    by_host: dict[str, list[RankView]],
    finding: Callable[..., Finding],
    *,
    links: LinkPaceConfig | None = None,
) -> list[Finding]:
    """The stall's network cause: an unhealthy IB/RoCE port on one of the job's hosts (faulty ports first).

    Every rank being inside the collective with none late means the ranks are fine and the transport is not;
    a port that is down, flapping, slow or erroring on a host of the job names the host and port. The rank
    named is the job's rank on a GPU the port serves (NCCL routes that GPU's traffic through it); the NCCL
    NET errors of that host, if any, are added as evidence.
    """
    out: list[Finding] = []
    causes = []
    for cause in stall_causes(fleet.hosts, by_host, ports, now, links):
        served = [v for v in by_host.get(cause.host, []) if v.gpu in cause.gpus]
        if served or cause.finding.kind == "faulty":  # a port serving none of the job's GPUs must be down
            causes.append((cause, served))
    if not causes:
        return out
    worst = causes[0][0].finding.kind
    for cause, served in causes:
        if cause.finding.kind != worst:
            break
        host = fleet.hosts.get(cause.host)
        net = [
            f"NCCL NET error on {cause.host}: {e.text[:160]}"
            for e in (host.events if host is not None else [])
            if e.kind == "nccl_warn_net" and now - e.seen_at <= cfg.net_error_window_s
        ][-2:]
        why = f"network: {cause.evidence[0]}"
        more = (*cause.evidence[1:], *net)
        if served:
            for view in served[: cfg.max_culprits]:
                out.append(finding(cause.finding.reason, "drain", view, cause.host, view.gpu, why, *more))
        else:
            out.append(finding(cause.finding.reason, "drain", None, cause.host, None, why, *more))
    return out


def _from_watchdog(
    job: JobView, fleet: FleetState, cfg: StuckConfig, now: float
) -> tuple[list[Finding], Stall | None]:
    """No heads: PyTorch watchdog timeouts name the waiting ranks; the members that did not time out stall."""
    hosts = {view.host for view in job.ranks.values() if view.host is not None}
    timed_out: dict[int, int] = {}
    for host_name in hosts:
        host = fleet.hosts.get(host_name)
        if host is None:
            continue
        for event in host.events:
            if (
                event.kind == "torch_watchdog_timeout"
                and event.rank is not None
                and event.seq is not None
                and now - event.seen_at <= cfg.net_error_window_s
                and event.rank in job.ranks
            ):
                timed_out[event.rank] = event.seq
    if not timed_out:
        return [], None
    seq = min(timed_out.values())
    waiting = sorted(timed_out)
    missing = sorted(r for r, view in job.ranks.items() if r not in timed_out and view.alive)
    stall = Stall(job=job.id, pg="watchdog", seq=seq, op="", waited_s=0.0, waiting=waiting, culprits=missing)
    head = f"PyTorch watchdog timed out in seq {seq} on rank(s) {_ranks_summary(waiting)}"
    findings = [
        Finding(
            key=("stuck", job.id, str(rank)),
            detector=DETECTOR,
            kind="stuck",
            reason="not_entered_collective",
            action="restart_app",
            evidence=(head, f"rank {rank} reported no timeout: it never entered seq {seq}"),
            evidence_t=now,
            host=job.ranks[rank].host,
            gpu=job.ranks[rank].gpu,
            job=job.id,
            rank=rank,
        )
        for rank in missing[: cfg.max_culprits]
    ]
    return findings, stall


def gpu_is_idle(gpu: GpuView | None) -> bool:
    return gpu is not None and gpu.util is not None and gpu.util < 20

"""Network detector: each host's IB/RoCE ports → one verdict per unhealthy port, naming what it serves.

The policy is the port component's (:mod:`sentinel.components.ib.rule`); this module joins its findings to
the fleet: the host, the device and port, the GPUs the port serves (PCI topology, from the agent) and the
job ranks on those GPUs, the kernel's mlx5 / IB lines about that HCA as evidence, and the action.

:func:`stall_causes` answers the stuck detector's question for a stall in which every rank is inside one
collective and none is late: is there a port on one of the job's hosts that explains it?
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.state import FleetState, HostView
from sentinel.aggregator.verdicts import Finding
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.rule import PortFinding, PortRuleConfig, evaluate_ports
from sentinel.components.linkpace.load import port_load
from sentinel.components.linkpace.rule import LinkLoad, LinkPaceConfig, standouts
from sentinel.config.aggregator import AggregatorConfig

DETECTOR = "network"
KERNEL_LINES_KEPT = 3
#: kernel lines older than this (aggregator clock) are no evidence for the port's state now
KERNEL_WINDOW_S = 600.0
_KIND_ORDER = {"faulty": 0, "degraded": 1}


@dataclass(frozen=True, slots=True)
class PortCause:
    """One port finding joined to the fleet (what a verdict or a stall's evidence names)."""

    host: str
    port: IbPort
    finding: PortFinding
    gpus: list[int]
    ranks: list[tuple[str, int]]  # (job, rank) on the GPUs the port serves
    evidence: tuple[str, ...]
    evidence_t: float  # aggregator clock


def port_key(host: str, device: str, port: int) -> tuple[str, ...]:
    return ("net", host, device, str(port))


def _served(host: HostView, port: IbPort) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for index in port.gpus:
        if 0 <= index < len(host.gpus):
            gpu = host.gpus[index]
            if gpu.job is not None and gpu.rank is not None:
                out.append((gpu.job, gpu.rank))
    return out


def _headline(host: HostView, port: IbPort, ranks: list[tuple[str, int]]) -> str:
    where = f"{host.name} {port.device} port {port.port} ({port.link_layer or 'unknown link layer'}"
    where += f", netdev {port.netdev})" if port.netdev else ")"
    if port.gpus:
        how = {"pcie_switch": "same PCIe switch", "numa": "same NUMA node"}.get(port.locality, port.locality)
        where += f" serves GPU {','.join(str(g) for g in port.gpus)} ({how})"
    else:
        where += " serves no GPU found in the PCI topology"
    jobs: dict[str, list[int]] = {}
    for job, rank in ranks:
        jobs.setdefault(job, []).append(rank)
    if jobs:
        where += "; " + "; ".join(
            f"job {job} rank(s) {','.join(str(r) for r in sorted(rs))}" for job, rs in sorted(jobs.items())
        )
    return where


def _kernel_lines(host: HostView, port: IbPort, now: float) -> list[str]:
    names = [n for n in (port.device, port.netdev, port.pci_bus) if n]
    found = [
        e.text
        for e in host.events
        if e.kind == "kernel_ib" and now - e.seen_at <= KERNEL_WINDOW_S and any(n in e.text for n in names)
    ]
    return [f"kernel: {text[:200]}" for text in found[-KERNEL_LINES_KEPT:]]


def host_causes(host: HostView, cfg: PortRuleConfig, now: float) -> list[PortCause]:
    """Every port finding of one host, joined (``now``: the aggregator clock)."""
    if not host.ports:
        return []
    ports = list(host.ports.values())
    out: list[PortCause] = []
    for f in evaluate_ports(ports, cfg, host.ports_t):
        port = host.ports.get(f"{f.device}/{f.port}")
        if port is None:
            continue
        ranks = _served(host, port)
        evidence = (_headline(host, port, ranks), *f.evidence, *_kernel_lines(host, port, now))
        age = max(0.0, host.ports_t - f.since)
        out.append(
            PortCause(
                host=host.name,
                port=port,
                finding=f,
                gpus=list(port.gpus),
                ranks=ranks,
                evidence=evidence,
                evidence_t=now - age,
            )
        )
    return out


def evaluate(
    fleet: FleetState, cfg: PortRuleConfig, now: float, quiet: dict[str, float] | None = None
) -> list[Finding]:
    """One finding per unhealthy port (the verdict book keeps the worst per port).

    ``quiet`` (host → ports_t) remembers hosts whose ports were all healthy at that reading; they are not
    judged again until a new reading arrives (a healthy port cannot turn unhealthy with time alone).
    """
    findings: list[Finding] = []
    for host in fleet.hosts.values():
        if quiet is not None and quiet.get(host.name) == host.ports_t:
            continue
        causes = host_causes(host, cfg, now)
        if quiet is not None:
            if causes:
                quiet.pop(host.name, None)
            else:
                quiet[host.name] = host.ports_t
        for cause in causes:
            f = cause.finding
            jobs = sorted({job for job, _ in cause.ranks})
            findings.append(
                Finding(
                    key=port_key(host.name, f.device, f.port),
                    detector=DETECTOR,
                    kind=f.kind,
                    reason=f.reason,
                    action=f.action,
                    evidence=cause.evidence,
                    evidence_t=cause.evidence_t,
                    host=host.name,
                    gpu=cause.gpus[0] if len(cause.gpus) == 1 else None,
                    job=jobs[0] if len(jobs) == 1 else None,
                    rank=cause.ranks[0][1] if len(cause.ranks) == 1 else None,
                )
            )
    return findings


def stall_causes(
    fleet: FleetState,
    hosts: Iterable[str],
    cfg: PortRuleConfig,
    now: float,
    links: LinkPaceConfig | None = None,
) -> list[PortCause]:
    """Ports on ``hosts`` whose findings explain a collective nobody completes: faulty ones first, then a
    port that stands out among the hosts' GPU rails by the link-pace judgement (waiting, congested or
    carrying less than its peers while the collective makes no progress)."""
    causes: list[PortCause] = []
    judged: list[tuple[HostView, IbPort]] = []
    for name in sorted(set(hosts)):
        host = fleet.hosts.get(name)
        if host is not None:
            causes.extend(host_causes(host, cfg, now))
            judged.extend((host, p) for p in host.ports.values() if p.up and p.gpus and p.rates)
    causes.extend(
        _standing_out(judged, {(c.host, c.port.key) for c in causes}, links or LinkPaceConfig(), now)
    )
    return sorted(causes, key=lambda c: (_KIND_ORDER.get(c.finding.kind, 9), c.host, c.port.key))


def _standing_out(
    ports: list[tuple[HostView, IbPort]], named: set[tuple[str, str]], cfg: LinkPaceConfig, now: float
) -> list[PortCause]:
    """The rails that stand out among ``ports`` (the link-pace judgement, on the latest readings)."""
    if not cfg.enabled:
        return []
    loads = []
    for host, port in ports:
        data, waits = port_load(port)
        loads.append(LinkLoad(host=host.name, link=port.key, bytes_per_s=data, waits=waits))
    by_key = {(host.name, port.key): (host, port) for host, port in ports}
    out: list[PortCause] = []
    for s in standouts(loads, cfg):
        host, port = by_key[(s.link.host, s.link.link)]
        if (host.name, port.key) in named:
            continue
        ranks = _served(host, port)
        evidence = tuple(f"{port.device} port {port.port} {line}" for line in s.evidence)
        finding = PortFinding(
            device=port.device,
            port=port.port,
            kind="degraded",
            action="drain",
            reason="link_slow",
            evidence=evidence,
            since=port.t,
        )
        out.append(
            PortCause(
                host=host.name,
                port=port,
                finding=finding,
                gpus=list(port.gpus),
                ranks=ranks,
                evidence=(_headline(host, port, ranks), *evidence),
                evidence_t=now,
            )
        )
    return out


class NetworkDetector(Detector):
    """The ports' history lives in the agents' records (flaps survive agent restarts there); the detector
    only remembers which hosts were quiet at their latest reading, to skip them until the next one."""

    name = DETECTOR

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self.quiet: dict[str, float] = {}

    def configure(self, config: AggregatorConfig) -> None:
        super().configure(config)
        self.quiet.clear()  # new thresholds: judge every host again

    def switched_on(self) -> None:
        self.quiet.clear()

    def host_forgotten(self, host: str) -> None:
        self.quiet.pop(host, None)

    def evaluate(self, seen: Observation) -> Evaluation:
        if len(self.quiet) > 2 * len(seen.fleet.hosts) + 1024:
            self.quiet = {h: t for h, t in self.quiet.items() if h in seen.fleet.hosts}
        return Evaluation(evaluate(seen.fleet, self.config.detect.network, seen.now, self.quiet))

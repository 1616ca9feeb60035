"""A host's unhealthy ports joined to what they serve: the port rule's findings with the GPUs behind each
port, the job ranks on those GPUs and the kernel's lines about the HCA as evidence.

Two consumers ask the same question: the network detector (one verdict per unhealthy port) and the stuck
detector (does a port on one of a stalled job's hosts explain a collective nobody completes?). The host is
read through :class:`PortHost`, a structural view the aggregator's host state satisfies, so the judgement
lives with its signal and neither detector imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sentinel.components.ib.record import IbPort
from sentinel.components.ib.rule import PortFinding, PortRuleConfig, evaluate_ports
from sentinel.components.linkpace.load import port_load
from sentinel.components.linkpace.rule import LinkLoad, LinkPaceConfig, standouts

KERNEL_LINES_KEPT = 3
#: kernel lines older than this (aggregator clock) are no evidence for the port's state now
KERNEL_WINDOW_S = 600.0
_KIND_ORDER = {"faulty": 0, "degraded": 1}


class ServedGpu(Protocol):
    """A GPU a port serves, with the job rank running on it (if any)."""

    @property
    def job(self) -> str | None: ...

    @property
    def rank(self) -> int | None: ...


class HostLogEvent(Protocol):
    """A classified log event kept for the host (``kernel_ib``: the kernel's lines about an HCA)."""

    @property
    def kind(self) -> str: ...

    @property
    def seen_at(self) -> float: ...

    @property
    def text(self) -> str: ...


class PortHost(Protocol):
    """What the port judgement reads of a host: its latest port records and what they can be joined to."""

    @property
    def name(self) -> str: ...

    @property
    def ports(self) -> Mapping[str, IbPort]: ...

    @property
    def ports_t(self) -> float: ...

    @property
    def gpus(self) -> Sequence[ServedGpu]: ...

    @property
    def events(self) -> Iterable[HostLogEvent]: ...


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


def _served(host: PortHost, port: IbPort) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for index in port.gpus:
        if 0 <= index < len(host.gpus):
            gpu = host.gpus[index]
            if gpu.job is not None and gpu.rank is not None:
                out.append((gpu.job, gpu.rank))
    return out


def _headline(host: PortHost, port: IbPort, ranks: list[tuple[str, int]]) -> str:
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


def _kernel_lines(host: PortHost, port: IbPort, now: float) -> list[str]:
    names = [n for n in (port.device, port.netdev, port.pci_bus) if n]
    found = [
        e.text
        for e in host.events
        if e.kind == "kernel_ib" and now - e.seen_at <= KERNEL_WINDOW_S and any(n in e.text for n in names)
    ]
    return [f"kernel: {text[:200]}" for text in found[-KERNEL_LINES_KEPT:]]


def host_causes(host: PortHost, cfg: PortRuleConfig, now: float) -> list[PortCause]:
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


def stall_causes(
    hosts: Mapping[str, PortHost],
    names: Iterable[str],
    cfg: PortRuleConfig,
    now: float,
    links: LinkPaceConfig | None = None,
) -> list[PortCause]:
    """Ports on the hosts ``names`` whose findings explain a collective nobody completes: faulty ones first,
    then a port that stands out among the hosts' GPU rails by the link-pace judgement (waiting, congested or
    carrying less than its peers while the collective makes no progress)."""
    causes: list[PortCause] = []
    judged: list[tuple[PortHost, IbPort]] = []
    for name in sorted(set(names)):
        host = hosts.get(name)
        if host is not None:
            causes.extend(host_causes(host, cfg, now))
            judged.extend((host, p) for p in host.ports.values() if p.up and p.gpus and p.rates)
    causes.extend(
        _standing_out(judged, {(c.host, c.port.key) for c in causes}, links or LinkPaceConfig(), now)
    )
    return sorted(causes, key=lambda c: (_KIND_ORDER.get(c.finding.kind, 9), c.host, c.port.key))


def _standing_out(
    ports: list[tuple[PortHost, IbPort]], named: set[tuple[str, str]], cfg: LinkPaceConfig, now: float
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

"""Network detector: each host's IB/RoCE ports → one verdict per unhealthy port, naming what it serves.

The policy is the port component's (:mod:`sentinel.components.ib.rule`); this module joins its findings to
the fleet: the host, the device and port, the GPUs the port serves (PCI topology, from the agent) and the
job ranks on those GPUs, the kernel's mlx5 / IB lines about that HCA as evidence, and the action.

The join itself (:mod:`sentinel.components.ib.causes`) is shared with the stuck detector, which asks it
whether a port on one of a stalled job's hosts explains a collective nobody completes.
"""

from __future__ import annotations

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.state import FleetState
from sentinel.aggregator.verdicts import Finding
from sentinel.components.ib.causes import host_causes
from sentinel.components.ib.rule import PortRuleConfig
from sentinel.config.aggregator import AggregatorConfig

DETECTOR = "network"


def port_key(host: str, device: str, port: int) -> tuple[str, ...]:
    return ("net", host, device, str(port))


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

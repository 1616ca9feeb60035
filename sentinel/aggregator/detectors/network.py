"""Network detector: each host-level signal of the registry judged by it (the IB/RoCE ports) → one verdict
per finding, keyed by the host and what on the host it is about.

The policy and the join to the fleet (the GPUs a port serves, the job ranks on them, the kernel's lines
about the HCA) are the signal's (``judge_host``: :mod:`sentinel.components.ib.judge`); this module runs it
for every host and remembers which hosts were healthy at their latest reading, to skip them until the next.
"""

from __future__ import annotations

from typing import Any

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.state import FleetState
from sentinel.aggregator.verdicts import Finding
from sentinel.components import registry
from sentinel.config.aggregator import AggregatorConfig

DETECTOR = "network"
#: the host-level signals this detector judges, in registry order
JUDGED = tuple(s for s in registry.SIGNALS if s.detector == DETECTOR and s.judge_host is not None)


def evaluate(
    fleet: FleetState, detect: Any, now: float, quiet: dict[str, tuple[float, ...]] | None = None
) -> list[Finding]:
    """Every finding of the judged signals on every host (the verdict book keeps the worst per key).

    ``quiet`` (host → the signals' reading times) remembers hosts that were healthy at those readings; they
    are not judged again until a new reading arrives (a healthy reading cannot turn unhealthy with time
    alone).
    """
    findings: list[Finding] = []
    for host in fleet.hosts.values():
        stamps = _stamps(host)
        if quiet is not None and stamps is not None and quiet.get(host.name) == stamps:
            continue
        judged = [j for signal in JUDGED if signal.judge_host for j in signal.judge_host(host, detect, now)]
        if quiet is not None and stamps is not None:
            if judged:
                quiet.pop(host.name, None)
            else:
                quiet[host.name] = stamps
        for j in judged:
            findings.append(
                Finding(
                    key=("net", host.name, *j.subject),
                    detector=DETECTOR,
                    kind=j.kind,
                    reason=j.reason,
                    action=j.action,
                    evidence=j.evidence,
                    evidence_t=j.evidence_t,
                    host=host.name,
                    gpu=j.gpu,
                    job=j.job,
                    rank=j.rank,
                )
            )
    return findings


def _stamps(host: Any) -> tuple[float, ...] | None:
    """The judged signals' latest reading times of ``host`` (None: one of them cannot tell)."""
    stamps = []
    for signal in JUDGED:
        if signal.reading_t is None:
            return None
        stamps.append(signal.reading_t(host))
    return tuple(stamps)


class NetworkDetector(Detector):
    """The ports' history lives in the agents' records (flaps survive agent restarts there); the detector
    only remembers which hosts were quiet at their latest reading, to skip them until the next one."""

    name = DETECTOR

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self.quiet: dict[str, tuple[float, ...]] = {}

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
        return Evaluation(evaluate(seen.fleet, self.config.detect, seen.now, self.quiet))

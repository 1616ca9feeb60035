"""Host-silent detector: a host whose agent has sent nothing for a while.

Silence is measured on the aggregator's clock from the last frame of any kind, so a host with skewed time
is judged fairly. The verdict closes as soon as the host is heard from again.
"""

from __future__ import annotations

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.state import FleetState
from sentinel.aggregator.verdicts import Finding

DETECTOR = "host_silent"


def evaluate(fleet: FleetState, silent_after_s: float, now: float) -> list[Finding]:
    found: list[Finding] = []
    for host in fleet.hosts.values():
        silent = now - host.last_seen
        if silent < silent_after_s:
            continue
        state = "connected but silent" if host.connected else "disconnected"
        found.append(
            Finding(
                key=("host_silent", host.name),
                detector=DETECTOR,
                kind="host_silent",
                reason="no_heartbeat",
                action="none",
                evidence=(
                    f"no frame from {host.name} for {silent:.0f}s (threshold {silent_after_s:g}s), {state}",
                    "check the host and its sentinel-agent service",
                ),
                evidence_t=host.last_seen,
                host=host.name,
            )
        )
    return found


class HostSilentDetector(Detector):
    """Stateless: the fleet's last-seen times say everything."""

    name = DETECTOR

    def evaluate(self, seen: Observation) -> Evaluation:
        return Evaluation(evaluate(seen.fleet, self.config.fleet.host_silent_after_s, seen.now))

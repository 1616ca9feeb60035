"""Host-health detector: the faults of a host that no GPU owns — a fatal NVSwitch SXid (the switch and
its SXid named once, not its eight GPUs), non-fatal SXids repeating, the fabric manager not running, an
mlx5 HCA dead, its firmware fatal or its commands timing out.

What each means is the components' (``components/xid/sxid.py``, ``components/fabric/host.py``,
``components/ib/hca.py``); this detector joins them to the host. Kernel-line facts last until the host
reboots (which resets its switches and HCAs); the fabric manager's verdict closes when it runs again.
"""

from __future__ import annotations

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.state import FleetState, HostView
from sentinel.aggregator.verdicts import Finding
from sentinel.components.fabric.host import FabricRuleConfig, judge_manager, judge_switches
from sentinel.components.ib.hca import judge_hcas
from sentinel.components.vocab import Finding as RuleFinding
from sentinel.components.vocab import verdict_kind

DETECTOR = "host_health"


def host_finding(
    key: tuple[str, ...], host: str, rule: RuleFinding, t: float, detector: str = DETECTOR
) -> Finding:
    """A component's finding about a whole host (no GPU) as ``detector``'s verdict finding."""
    return Finding(
        key=key,
        detector=detector,
        kind=verdict_kind(rule.state),
        reason=rule.reason,
        action=rule.action,
        evidence=rule.evidence,
        evidence_t=t,
        host=host,
    )


def evaluate_host(host: HostView, settings: FabricRuleConfig) -> list[Finding]:
    """The host's findings at its agent's latest time."""
    found: list[Finding] = []
    now = host.last_t
    for switch, rule, t in judge_switches(host.switches, settings, now):
        found.append(host_finding(("nvswitch", host.name, switch), host.name, rule, t))
    manager = judge_manager(host.fabric_manager, settings, now)
    if manager is not None and host.fabric_manager is not None:
        found.append(
            host_finding(("fabric_manager", host.name), host.name, manager, host.fabric_manager.since)
        )
    for rule, t in judge_hcas(host.hcas):
        found.append(host_finding(("hca", host.name, rule.reason), host.name, rule, t))
    return found


def evaluate(fleet: FleetState, settings: FabricRuleConfig) -> list[Finding]:
    found: list[Finding] = []
    for host in fleet.hosts.values():
        if host.switches.switches or host.hcas.first or host.fabric_manager is not None:
            found.extend(evaluate_host(host, settings))
    return found


class HostHealthDetector(Detector):
    """Stateless: the hosts' switch, HCA and fabric-manager memories say everything."""

    name = DETECTOR

    def evaluate(self, seen: Observation) -> Evaluation:
        return Evaluation(evaluate(seen.fleet, self.config.detect.fabric))

"""Inventory detector: hosts that cannot use their GPUs or have fewer than expected (a host verdict), GPUs
whose driver or VBIOS differs from their identical peers across the fleet, and hosts whose inventory (GPU
count, model, PCIe link capability) is not what is configured or learned for them (degraded verdicts naming
what differs). What is learned is voted by hosts, one vote each, and a verdict resting on it carries how many
other hosts back it (``Finding.learned_from``). Rules: :mod:`sentinel.components.device.inventory`. With an
NVLink domain's expected size configured (``detect.fabric_domain``), a domain with fewer GPUs or hosts
reporting is a degraded domain verdict (:mod:`sentinel.components.fabric.domain`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sentinel.aggregator.detectors.base import (
    ITEMS_PER_STEP,
    Detector,
    Evaluation,
    Observation,
    Steps,
    run_steps,
)
from sentinel.aggregator.state import HostView
from sentinel.aggregator.verdicts import Finding
from sentinel.components.device.inventory import (
    GpuFacts,
    GpuIdentity,
    HostFacts,
    evaluate_source,
    expectations,
    firmware_outliers,
    inventory_mismatches,
    learned_backing,
)
from sentinel.components.fabric.domain import DOMAIN_INCOMPLETE, domain_name, domain_sizes
from sentinel.components.vocab import verdict_kind
from sentinel.config.aggregator import AggregatorConfig

DETECTOR = "inventory"
#: hosts whose facts are built between two yields (each host's 8 GPUs)
HOSTS_PER_STEP = ITEMS_PER_STEP // 8


@dataclass(slots=True)
class _Kept:
    """One host's inputs to the rules, as of its ``inventory_version``."""

    version: int
    identities: list[GpuIdentity]
    facts: HostFacts | None
    source: Finding | None


class InventoryDetector(Detector):
    """Keeps each host's facts until its inventory changes: the agents' hellos and batches carry the
    inventory and the GPU source's health, which change at hellos, not every tick."""

    name = DETECTOR
    #: the whole fleet is compared, so at most this often (inventories change at hellos, not every tick)
    INTERVAL_S = 10.0

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self._next = -math.inf
        #: host → its facts; rebuilding them for a whole fleet every run would cost seconds of a core
        self._kept: dict[str, _Kept] = {}
        #: the findings of the last run, reused while no host's inventory changed and none came or went
        self._last: list[Finding] | None = None

    def switched_on(self) -> None:
        self._next = -math.inf
        self._last = None

    def configure(self, config: AggregatorConfig) -> None:
        super().configure(config)
        self._last = None  # new expectations: judge afresh

    def host_forgotten(self, host: str) -> None:
        self._kept.pop(host, None)
        self._last = None

    def evaluate(self, seen: Observation) -> Evaluation | None:
        return run_steps(self.evaluate_steps(seen))

    def evaluate_steps(self, seen: Observation) -> Steps[Evaluation | None]:
        """Sliced over hosts (a yield every :data:`HOSTS_PER_STEP` whose facts had to be built): the first
        run over a large fleet would otherwise hold the event loop in one piece."""
        if seen.now < self._next:
            return None
        self._next = seen.now + self.INTERVAL_S
        kept = self._kept
        hosts = seen.fleet.hosts
        changed = len(kept) != len(hosts)
        built = 0
        for host in list(hosts.values()):
            mine = kept.get(host.name)
            if mine is None or mine.version != host.inventory_version:
                kept[host.name] = _keep(host)
                changed = True
                built += 1
                if built % HOSTS_PER_STEP == 0:
                    yield
        if len(kept) != len(hosts) or built >= HOSTS_PER_STEP:
            # (after a yield the counts may match while a host forgotten meanwhile was kept again above)
            self._kept = kept = {name: k for name, k in kept.items() if name in hosts}
        if not changed and self._last is not None:
            return Evaluation([*self._last, *self._domains(hosts, seen.now)])
        findings: list[Finding] = [k.source for k in kept.values() if k.source is not None]
        identities = [identity for k in kept.values() for identity in k.identities]
        quorum = self.config.detect.inventory.min_hosts
        for (host_name, index), what in sorted(firmware_outliers(identities, quorum).items()):
            findings.append(
                Finding(
                    key=("inventory", host_name, str(index)),
                    detector=DETECTOR,
                    kind="degraded",
                    reason="firmware_mismatch",
                    action="drain",
                    evidence=tuple(what.evidence),
                    evidence_t=seen.now,
                    host=host_name,
                    gpu=index,
                    learned_from=what.backing,
                )
            )
        yield  # (the firmware comparison above and the expectations below each go over every GPU)
        findings.extend(self._expected([k.facts for k in kept.values() if k.facts is not None], seen.now))
        self._last = list(findings)
        return Evaluation([*findings, *self._domains(hosts, seen.now)])

    def _domains(self, hosts: dict[str, HostView], now: float) -> list[Finding]:
        """One degraded verdict per NVLink domain with fewer GPUs or hosts reporting than configured (each
        run: membership moves with the GPUs' fabric readings, not with their inventory)."""
        cfg = self.config.detect.fabric_domain
        if not cfg.expected_gpus and not cfg.expected_hosts:
            return []
        members = (
            (host.name, g.index, getattr(g.memory.get("fabric"), "info", None))
            for host in hosts.values()
            for g in host.gpus
        )
        out: list[Finding] = []
        for size in domain_sizes(members):
            short = size.shortfall(cfg)
            if not short:
                continue
            out.append(
                Finding(
                    key=("inventory", "fabric_domain", size.key[0], str(size.key[1])),
                    detector=DETECTOR,
                    kind=verdict_kind(DOMAIN_INCOMPLETE.state),
                    reason=DOMAIN_INCOMPLETE.reason,
                    action=DOMAIN_INCOMPLETE.action,
                    evidence=(
                        f"NVLink domain {domain_name(size.key)}: " + "; ".join(short),
                        "reporting: " + ", ".join(size.hosts[:24]) + (" ..." if len(size.hosts) > 24 else ""),
                    ),
                    evidence_t=now,
                )
            )
        return out

    def _expected(self, facts: list[HostFacts], now: float) -> list[Finding]:
        """One degraded host verdict per host whose inventory differs from what is expected of it."""
        config = self.config.detect.inventory
        expected = expectations(facts, config)
        out: list[Finding] = []
        for host in facts:
            what = inventory_mismatches(host, expected[host.host])
            if not what:
                continue
            gpus = {m.gpu for m in what}
            out.append(
                Finding(
                    key=("inventory", host.host, "expected"),
                    detector=DETECTOR,
                    kind="degraded",
                    reason="inventory_mismatch",
                    action="drain",
                    evidence=tuple(m.text for m in what[:16]),
                    evidence_t=now,
                    host=host.host,
                    gpu=gpus.pop() if len(gpus) == 1 and None not in gpus else None,
                    learned_from=learned_backing(what),
                )
            )
        return out


def _keep(host: HostView) -> _Kept:
    source = None
    if host.gpu_source is not None:
        rule = evaluate_source(host.gpu_source)
        if rule is not None:
            source = Finding(
                key=("inventory", host.name),
                detector=DETECTOR,
                kind=verdict_kind(rule.state),
                reason=rule.reason,
                action=rule.action,
                evidence=rule.evidence,
                evidence_t=host.gpu_source_t,
                host=host.name,
            )
    identities = [
        GpuIdentity(host=host.name, gpu=g.index, model=g.name, driver=g.driver, vbios=g.vbios)
        for g in host.gpus
    ]
    return _Kept(host.inventory_version, identities, _facts(host) if host.gpus else None, source)


def _facts(host: HostView) -> HostFacts:
    return HostFacts(
        host=host.name,
        gpus=tuple(
            GpuFacts(
                index=g.index,
                model=g.name,
                pcie_width_max=g.pcie_link.width_max if g.pcie_link is not None else None,
                pcie_gen_max=g.pcie_link.gen_max if g.pcie_link is not None else None,
            )
            for g in host.gpus
        ),
    )

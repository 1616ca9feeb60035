"""Inventory detector: hosts that cannot use their GPUs or have fewer than expected (a host verdict), and GPUs
whose driver or VBIOS differs from their identical peers across the fleet (a degraded verdict naming what
differs). Rules: :mod:`sentinel.components.device.inventory`.
"""

from __future__ import annotations

import math

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.verdicts import Finding
from sentinel.components.device.inventory import GpuIdentity, evaluate_source, firmware_outliers
from sentinel.components.vocab import verdict_kind
from sentinel.config.aggregator import AggregatorConfig

DETECTOR = "inventory"


class InventoryDetector(Detector):
    """Stateless: the agents' hellos and batches carry the inventory and the GPU source's health."""

    name = DETECTOR
    #: the whole fleet is compared, so at most this often (inventories change at hellos, not every tick)
    INTERVAL_S = 10.0

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self._next = -math.inf

    def switched_on(self) -> None:
        self._next = -math.inf

    def evaluate(self, seen: Observation) -> Evaluation | None:
        if seen.now < self._next:
            return None
        self._next = seen.now + self.INTERVAL_S
        findings: list[Finding] = []
        identities: list[GpuIdentity] = []
        for host in seen.fleet.hosts.values():
            if host.gpu_source is not None:
                rule = evaluate_source(host.gpu_source)
                if rule is not None:
                    findings.append(
                        Finding(
                            key=("inventory", host.name),
                            detector=DETECTOR,
                            kind=verdict_kind(rule.state),
                            reason=rule.reason,
                            action=rule.action,
                            evidence=rule.evidence,
                            evidence_t=host.gpu_source_t,
                            host=host.name,
                        )
                    )
            identities.extend(
                GpuIdentity(host=host.name, gpu=g.index, model=g.name, driver=g.driver, vbios=g.vbios)
                for g in host.gpus
            )
        for (host_name, index), what in sorted(firmware_outliers(identities).items()):
            findings.append(
                Finding(
                    key=("inventory", host_name, str(index)),
                    detector=DETECTOR,
                    kind="degraded",
                    reason="firmware_mismatch",
                    action="drain",
                    evidence=tuple(what),
                    evidence_t=seen.now,
                    host=host_name,
                    gpu=index,
                )
            )
        return Evaluation(findings)

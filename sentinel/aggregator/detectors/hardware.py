"""Hardware detector: one GPU's own evidence → at most one verdict for it (faulty or degraded), as the shared
hardware judgement (:mod:`sentinel.components.hardware`: each judged GPU signal on its own memory) finds it.

Runs on the GPUs whose hardware facts changed in the batch just applied, so a critical Xid, a lost GPU or a
pending row remap opens its verdict in the same tick the agent reported it. Pure: the GPU's state, the
thresholds and ``now`` in, findings out.

One verdict names the cause, not the symptom: Xid 79 ("fallen off the bus") is why NVML calls the GPU lost,
and the two reach the aggregator in either order (the agent holds an Xid up to ``xid_merge_wait_s`` for its
kernel-log twin, the lost state rides on the next sample). A lost GPU with a fatal Xid is the Xid's verdict,
the lost state added as evidence; a lost GPU without one is named ``gpu_lost`` only once its agent has
reported ``lost_cause_wait_s`` past the loss, so the first verdict opened already has its final name.

An NVLink domain (GB200 NVL72: GPUs sharing a fabric cluster UUID and clique id) is one failure unit: once
GPUs of ``detect.fabric_domain.min_hosts`` hosts of a domain lose their fabric within ``window_s`` of each
other, their fabric findings fold into one ``fabric_domain_down`` verdict naming every host of the domain
(:mod:`sentinel.components.fabric.domain`); what else each GPU shows stays its own verdict. Likewise every
GPU of one host unregistered for ``detect.fabric.not_completed_after_s`` is one ``fabric_not_completed`` host
verdict (:func:`sentinel.components.fabric.host.judge_host_fabric`), unless their domain's verdict names it.
"""

from __future__ import annotations

from typing import Any

from sentinel.aggregator.detectors.base import Detector, Evaluation, Key, Observation
from sentinel.aggregator.detectors.host_health import host_finding
from sentinel.aggregator.verdicts import Finding
from sentinel.components.ecc.rule import EccThresholds
from sentinel.components.fabric.domain import (
    DOMAIN_DOWN,
    DOMAIN_REASONS,
    DomainDown,
    DomainKey,
    FabricDomainConfig,
    Loss,
    domain_down,
    domain_of,
)
from sentinel.components.fabric.host import GpuFabric, judge_host_fabric
from sentinel.components.fabric.rule import NOT_REGISTERED
from sentinel.components.gpu_view import GpuView
from sentinel.components.hardware import judge_gpu, judge_settings
from sentinel.components.signal import JudgeSettings
from sentinel.components.vocab import verdict_kind
from sentinel.components.xid.rule import XidPolicyConfig
from sentinel.components.xid.storm import STORM, Burst
from sentinel.config.aggregator import AggregatorConfig, HardwareConfig

DETECTOR = "hardware"


class HardwareDetector(Detector):
    """Runs on the GPUs whose facts changed (at ingest and on the tick) and, on the tick, re-checks the GPUs
    it found something on last time: evidence that fades with time (an error rate) closes their verdict."""

    name = DETECTOR
    on_ingest = True

    def __init__(self, config: AggregatorConfig) -> None:
        super().__init__(config)
        self.flagged: set[tuple[str, int]] = set()  # GPUs with findings at their latest evaluation
        #: lost GPUs (re-checked on every tick: ``gpu_lost`` waits for the Xid that may explain it) → when the
        #: aggregator first saw them lost, so the wait also ends for a host that sends nothing more
        self.held: dict[tuple[str, int], float] = {}
        self.recheck_all = False
        #: each GPU's NVLink domain as last evaluated, each domain's GPUs, and those whose fabric is lost now
        self.domain: dict[tuple[str, int], DomainKey] = {}
        self.members: dict[DomainKey, set[tuple[str, int]]] = {}
        self.losses: dict[DomainKey, dict[tuple[str, int], Loss]] = {}
        #: domains found down at their latest evaluation
        self.down: set[DomainKey] = set()
        #: hosts whose GPUs' fabric registration is down as a whole at their latest evaluation
        self.hosts_down: set[str] = set()
        #: keys of the storm verdicts found last time (a storm that is over closes its verdict)
        self.storm_keys: set[Key] = set()

    def switched_on(self) -> None:
        self.recheck_all = True  # changes made while it was off were drained unseen

    def evaluate(self, seen: Observation) -> Evaluation | None:
        gpus = {(g.host, g.index): g for g in seen.changed_gpus}
        if seen.tick and self.recheck_all:
            self.recheck_all = False
            for host_view in seen.fleet.hosts.values():
                for each in host_view.gpus:
                    gpus.setdefault((each.host, each.index), each)
        if seen.tick:
            for host, index in self.flagged | self.held.keys():
                if (host, index) not in gpus:
                    known = seen.fleet.gpu(host, index)
                    if known is not None:
                        gpus[(host, index)] = known
        findings: list[Finding] = []
        keys: set[Key] = set()
        if seen.tick:
            storms = storm_findings(seen.fleet.xid_storms.storms(seen.now), seen.fleet.xid_storms.window_s)
            keys |= self.storm_keys
            self.storm_keys = {f.key for f in storms}
            keys |= self.storm_keys
            findings.extend(storms)
        if (
            not gpus and not self.down and not self.hosts_down
        ):  # (a down domain is looked at again: its hosts may be gone)
            return Evaluation(findings, scope=keys.__contains__) if keys else None
        detect = self.config.detect
        settings = judge_settings(detect.hardware, detect.ecc, detect.xid)
        per_gpu = {where: self._judge(seen, where, gpu, settings, keys) for where, gpu in gpus.items()}
        touched = {self.domain[where] for where in gpus if where in self.domain} | self.down
        downs = self._domains(seen, touched, detect.fabric_domain)
        changed = (touched & self.down) ^ set(downs)  # domains that went down or came back up
        self.down = (self.down - touched) | set(downs)
        for key in changed:  # their GPUs' own fabric verdicts fold into, or come back out of, the domain's
            for where in list(self.losses.get(key, {})):
                gpu = seen.fleet.gpu(*where)
                if where not in per_gpu and gpu is not None:
                    per_gpu[where] = self._judge(seen, where, gpu, settings, keys)
        hosts = {host for host, _ in per_gpu} | self.hosts_down
        hosts_down = self._hosts_down(seen, hosts)
        for host in (
            hosts & self.hosts_down
        ) ^ hosts_down.keys():  # their GPUs' fabric verdicts fold or return
            view = seen.fleet.hosts.get(host)
            for gpu in view.gpus if view is not None else ():
                if (host, gpu.index) not in per_gpu:
                    per_gpu[(host, gpu.index)] = self._judge(seen, (host, gpu.index), gpu, settings, keys)
        self.hosts_down = (self.hosts_down - hosts) | hosts_down.keys()
        for where, found in per_gpu.items():
            folded = self.domain.get(where) in self.down
            host_folded = where[0] in self.hosts_down
            findings.extend(
                f
                for f in found
                if not (folded and f.reason in DOMAIN_REASONS)
                and not (host_folded and f.reason == NOT_REGISTERED)
            )
        keys.update(host_fabric_key(host) for host in hosts)
        findings.extend(hosts_down.values())
        if not self.recheck_all:  # (after a restore, a domain is judged whole on the tick's look at all)
            keys.update(domain_key(key) for key in touched)
        findings.extend(domain_finding(down) for down in downs.values())
        self.flagged = {(h, i) for h, i in self.flagged if seen.fleet.gpu(h, i) is not None}
        self.held = {k: v for k, v in self.held.items() if seen.fleet.gpu(*k) is not None}
        return Evaluation(findings, scope=keys.__contains__)

    def _judge(
        self,
        seen: Observation,
        where: tuple[str, int],
        gpu: GpuView,
        settings: JudgeSettings,
        keys: set[Key],
    ) -> list[Finding]:
        """One GPU's findings; its NVLink domain and fabric loss remembered."""
        keys.add(gpu_key(gpu.host, gpu.index))
        its_host = seen.fleet.hosts.get(gpu.host)
        reported = its_host.last_t if its_host is not None else gpu.t
        if gpu.state == "lost":
            # the agent's time, or the time the aggregator has waited since, whichever went further
            began = self.held.setdefault(where, seen.now)
            reported = max(reported, gpu.state_t + seen.now - began)
        else:
            self.held.pop(where, None)
        found = evaluate_gpu(
            gpu, self.config.detect.hardware, seen.now, reported_until=reported, settings=settings
        )
        if found:
            self.flagged.add(where)
        else:
            self.flagged.discard(where)
        self._place(where, gpu, found)
        return found

    def _place(self, where: tuple[str, int], gpu: GpuView, found: list[Finding]) -> None:
        """Remember ``gpu``'s domain and whether (since when) it lost its fabric."""
        fabric = gpu.memory.get("fabric")
        key = domain_of(getattr(fabric, "info", None))
        old = self.domain.get(where)
        if old is not None and old != key:
            self._forget(where)
        if key is None:
            return
        self.domain[where] = key
        self.members.setdefault(key, set()).add(where)
        lost = [f for f in found if f.reason in DOMAIN_REASONS]
        losses = self.losses.setdefault(key, {})
        if not lost:
            losses.pop(where, None)
            return
        first = min(lost, key=lambda f: f.evidence_t)
        known = losses.get(where)
        t = first.evidence_t if known is None else min(known.t, first.evidence_t)
        losses[where] = Loss(host=gpu.host, gpu=gpu.index, t=t, reason=first.reason)

    def _forget(self, where: tuple[str, int]) -> None:
        key = self.domain.pop(where, None)
        if key is None:
            return
        members = self.members.get(key, set())
        members.discard(where)
        if not members:
            self.members.pop(key, None)
        losses = self.losses.get(key, {})
        losses.pop(where, None)
        if not losses:
            self.losses.pop(key, None)

    def _domains(
        self, seen: Observation, touched: set[DomainKey], cfg: FabricDomainConfig
    ) -> dict[DomainKey, DomainDown]:
        """The touched domains that are down now (their losses, every member host)."""
        out: dict[DomainKey, DomainDown] = {}
        for key in touched:
            for where in [w for w in self.members.get(key, ()) if seen.fleet.gpu(*w) is None]:
                self._forget(where)  # gone from the fleet (its host's inventory shrank)
            losses = self.losses.get(key)
            if not losses:
                continue
            members = {host for host, _ in self.members.get(key, ())}
            down = domain_down(key, losses.values(), members, cfg)
            if down is not None:
                out[key] = down
        return out

    def _hosts_down(self, seen: Observation, hosts: set[str]) -> dict[str, Finding]:
        """The ``hosts`` whose GPUs are all unregistered from the fabric past the grace, and not in a domain
        found down (whose verdict names them already): each one's host verdict."""
        out: dict[str, Finding] = {}
        for host in hosts:
            view = seen.fleet.hosts.get(host)
            if view is None:
                continue
            fabric: list[GpuFabric] = []
            for gpu in view.gpus:
                memory = gpu.memory.get("fabric")
                info = getattr(memory, "info", None)
                if info is not None:
                    fabric.append(GpuFabric(gpu=gpu.index, info=info, t=getattr(memory, "t", 0.0)))
                if self.domain.get((host, gpu.index)) in self.down:
                    break
            else:
                judged = judge_host_fabric(
                    fabric, view.fabric_manager, self.config.detect.fabric, view.last_t
                )
                if judged is not None:
                    rule, t = judged
                    out[host] = host_finding(host_fabric_key(host), host, rule, t, DETECTOR)
        return out

    def host_forgotten(self, host: str) -> None:
        self.hosts_down.discard(host)
        self.flagged = {(h, i) for h, i in self.flagged if h != host}
        self.held = {k: v for k, v in self.held.items() if k[0] != host}
        for where in [w for w in self.domain if w[0] == host]:
            self._forget(where)

    def snapshot(self) -> dict[str, Any]:
        return {
            "flagged": sorted([h, i] for h, i in self.flagged),
            "held": sorted([h, i] for h, i in self.held),
            "storms": sorted(list(key) for key in self.storm_keys),
        }


def storm_findings(storms: list[Burst], window_s: float) -> list[Finding]:
    """One informational verdict per Xid storm, naming its origin GPU: never a drain (action none)."""
    return [
        Finding(
            key=("xid_storm", storm.scope),
            detector=DETECTOR,
            kind=verdict_kind(STORM.state),
            reason=STORM.reason,
            action=STORM.action,
            evidence=tuple(storm.evidence(window_s)),
            evidence_t=storm.first_t,
            host=storm.origin.host,
            gpu=storm.origin.gpu,
            job=storm.job,
        )
        for storm in storms
    ]


def gpu_key(host: str, gpu: int) -> tuple[str, ...]:
    return ("hw", host, str(gpu))


def host_fabric_key(host: str) -> tuple[str, ...]:
    return ("fabric_host", host)


def domain_key(key: DomainKey) -> tuple[str, ...]:
    return ("fabric_domain", key[0], str(key[1]))


def domain_finding(down: DomainDown) -> Finding:
    """One verdict for a domain that lost its fabric: faulty, ``drain`` every host of it (per the
    remediation policy's ``drain_domains``)."""
    return Finding(
        key=domain_key(down.key),
        detector=DETECTOR,
        kind=verdict_kind(DOMAIN_DOWN.state),
        reason=DOMAIN_DOWN.reason,
        action=DOMAIN_DOWN.action,
        evidence=down.evidence(),
        evidence_t=down.began,
        hosts=down.hosts,
    )


def evaluate_gpu(
    gpu: GpuView,
    cfg: HardwareConfig,
    now: float,
    ecc_limits: EccThresholds | None = None,
    *,
    reported_until: float | None = None,
    settings: JudgeSettings | None = None,
) -> list[Finding]:
    """Every hardware problem of ``gpu`` that is true now (the book merges them into one verdict), as
    :func:`sentinel.components.hardware.judge_gpu` judges it, each a finding for this detector.

    ``reported_until``: agent time of the host's latest batch (default: the GPU's latest sample), against
    which a lost GPU's wait for its Xid is measured.
    """
    if settings is None:
        settings = judge_settings(cfg, ecc_limits, XidPolicyConfig())
    key = gpu_key(gpu.host, gpu.index)
    job = gpu.job if gpu.job is not None else gpu.last_job
    rank = gpu.rank if gpu.job is not None else gpu.last_rank
    found: list[Finding] = []
    for judged in judge_gpu(gpu, settings, now, reported_until=reported_until):
        rule = judged.finding
        found.append(
            Finding(
                key=key,
                detector=DETECTOR,
                kind=verdict_kind(rule.state),
                reason=rule.reason,
                action=rule.action,
                evidence=rule.evidence,
                evidence_t=judged.t,
                host=gpu.host,
                gpu=gpu.index,
                job=job,
                rank=rank,
            )
        )
    return found

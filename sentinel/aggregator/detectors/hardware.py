"""Hardware detector: one GPU's own evidence → at most one verdict for it (faulty or degraded).

Runs on the GPUs whose hardware facts changed in the batch just applied, so a critical Xid, a lost GPU or a
pending row remap opens its verdict in the same tick the agent reported it. Pure: the GPU's state, the
thresholds and ``now`` in, findings out.

One verdict names the cause, not the symptom: Xid 79 ("fallen off the bus") is why NVML calls the GPU lost,
and the two reach the aggregator in either order (the agent holds an Xid up to ``xid_merge_wait_s`` for its
kernel-log twin, the lost state rides on the next sample). A lost GPU with a fatal Xid is the Xid's verdict,
the lost state added as evidence; a lost GPU without one is named ``gpu_lost`` only once its agent has
reported ``lost_cause_wait_s`` past the loss, so the first verdict opened already has its final name.
"""

from __future__ import annotations

from typing import Any

from sentinel.aggregator.detectors.base import Detector, Evaluation, Key, Observation
from sentinel.aggregator.state import GpuView, counter_rate
from sentinel.aggregator.verdicts import Finding
from sentinel.components.device.rule import evaluate_recovery_action, evaluate_state
from sentinel.components.ecc.rule import EccThresholds, evaluate_ecc
from sentinel.components.fabric.rule import evaluate_fabric
from sentinel.components.nvlink.rule import evaluate_error_rate
from sentinel.components.pcie.rule import evaluate_link, evaluate_replay_rate
from sentinel.components.rowremap.rule import evaluate_row_remap
from sentinel.components.vocab import Action, VerdictKind, verdict_kind, worse_action
from sentinel.components.vocab import Finding as RuleFinding
from sentinel.components.xid.catalog import GPU_LOST_CODES, xid_info
from sentinel.config.aggregator import AggregatorConfig, HardwareConfig

DETECTOR = "hardware"
#: The kernel's announcements of what the row-remap counters say precisely.
REMAP_REASONS = frozenset({"xid_63", "xid_64", "xid_63_repeated", "xid_64_repeated"})


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
        if not gpus:
            return None
        findings: list[Finding] = []
        keys: set[Key] = set()
        detect = self.config.detect
        for where, gpu in gpus.items():
            keys.add(gpu_key(gpu.host, gpu.index))
            its_host = seen.fleet.hosts.get(gpu.host)
            reported = its_host.last_t if its_host is not None else gpu.t
            if gpu.state == "lost":
                # the agent's time, or the time the aggregator has waited since, whichever went further
                began = self.held.setdefault(where, seen.now)
                reported = max(reported, gpu.state_t + seen.now - began)
            else:
                self.held.pop(where, None)
            found = evaluate_gpu(gpu, detect.hardware, seen.now, detect.ecc, reported_until=reported)
            if found:
                self.flagged.add(where)
            else:
                self.flagged.discard(where)
            findings.extend(found)
        self.flagged = {(h, i) for h, i in self.flagged if seen.fleet.gpu(h, i) is not None}
        self.held = {k: v for k, v in self.held.items() if seen.fleet.gpu(*k) is not None}
        return Evaluation(findings, scope=keys.__contains__)

    def host_forgotten(self, host: str) -> None:
        self.flagged = {(h, i) for h, i in self.flagged if h != host}
        self.held = {k: v for k, v in self.held.items() if k[0] != host}

    def snapshot(self) -> dict[str, Any]:
        return {
            "flagged": sorted([h, i] for h, i in self.flagged),
            "held": sorted([h, i] for h, i in self.held),
        }


def xid_rule_meaning(reason: str) -> str:
    """``xid_79`` / ``xid_13_repeated`` → the catalog's name of the code and NVIDIA's bucket for it."""
    code = reason.removeprefix("xid_").split("_", 1)[0]
    if not code.isdigit():
        return reason
    info = xid_info(int(code))
    return f"{info.name}, NVIDIA {info.bucket}" if info.bucket else info.name


def gpu_key(host: str, gpu: int) -> tuple[str, ...]:
    return ("hw", host, str(gpu))


def explains_lost(gpu: GpuView) -> bool:
    """A latched fatal Xid that says the driver lost the GPU (79) is the cause a lost GPU's verdict names;
    NVML's lost state is its symptom. Another fatal Xid (a double-bit error) does not explain it."""
    decision = gpu.xid
    return (
        decision is not None and decision.state == "faulty" and not GPU_LOST_CODES.isdisjoint(gpu.xid_codes)
    )


def lost_cause_pending(gpu: GpuView, cfg: HardwareConfig, reported_until: float) -> bool:
    """``gpu`` is lost, no Xid explains it yet, and its agent has not reported long enough past the loss
    for the Xid to have arrived: ``gpu_lost`` waits (agent time, so a skewed clock or a restart cannot
    stretch or skip the wait; a lost state restored from the store is long past it)."""
    return (
        gpu.state == "lost"
        and not explains_lost(gpu)
        and reported_until - gpu.state_t < cfg.lost_cause_wait_s
    )


def evaluate_gpu(
    gpu: GpuView,
    cfg: HardwareConfig,
    now: float,
    ecc_limits: EccThresholds | None = None,
    *,
    reported_until: float | None = None,
) -> list[Finding]:
    """Every hardware problem of ``gpu`` that is true now (the book merges them into one verdict).

    ``reported_until``: agent time of the host's latest batch (default: the GPU's latest sample), against
    which a lost GPU's wait for its Xid is measured.
    """
    found: list[Finding] = []
    key = gpu_key(gpu.host, gpu.index)

    def add(kind: VerdictKind, reason: str, action: Action, t: float, *evidence: str) -> None:
        found.append(
            Finding(
                key=key,
                detector=DETECTOR,
                kind=kind,
                reason=reason,
                action=action,
                evidence=evidence,
                evidence_t=t,
                host=gpu.host,
                gpu=gpu.index,
                job=gpu.job if gpu.job is not None else gpu.last_job,
                rank=gpu.rank if gpu.job is not None else gpu.last_rank,
            )
        )

    remap_known = gpu.remap is not None and (gpu.remap.pending or gpu.remap.failure)
    decision = gpu.xid
    lost = evaluate_state("lost") if gpu.state == "lost" else None
    explained = False
    if (
        decision is not None
        and decision.state != "ok"
        and not (remap_known and decision.reason in REMAP_REASONS)
    ):
        # the signals Xid policy: fatal codes → faulty at once; repeats from many processes → suspect
        kind: VerdictKind = "faulty" if decision.state == "faulty" else "degraded"
        codes = ", ".join(f"Xid {code}" for code in sorted(gpu.xid_codes))
        evidence = [
            f"{decision.reason} ({xid_rule_meaning(decision.reason)}); seen since the last reset: {codes}"
        ]
        evidence += list(decision.evidence[-3:])
        action = decision.action
        t = decision.since if decision.since is not None else now
        if lost is not None and explains_lost(gpu):
            # the Xid is the cause, the lost state its symptom: one verdict named by the Xid
            explained = True
            evidence += list(lost.evidence)
            action = worse_action(action, lost.action)
            t = min(t, gpu.state_t)
        add(kind, decision.reason, action, t, *evidence)

    def rule(finding: RuleFinding | None, t: float) -> None:
        if finding is not None and finding.state != "ok":
            add(verdict_kind(finding.state), finding.reason, finding.action, t, *finding.evidence)

    if lost is None:
        rule(evaluate_state(gpu.state), gpu.state_t)  # type: ignore[arg-type]
    elif not explained and not lost_cause_pending(
        gpu, cfg, gpu.t if reported_until is None else reported_until
    ):
        rule(lost, gpu.state_t)
    rule(evaluate_recovery_action(gpu.recovery_action), gpu.slow_t)
    if gpu.pcie_link is not None:
        rule(evaluate_link(gpu.pcie_link), gpu.slow_t)
    if gpu.fabric is not None:
        rule(evaluate_fabric(gpu.fabric), gpu.slow_t)
    # memory health (row remapping, ECC): faulty stays faulty, suspect → degraded
    if gpu.remap is not None:
        rule(evaluate_row_remap(gpu.remap, gpu.remap_prev), gpu.remap_t)
    if gpu.ecc is not None:
        rule(evaluate_ecc(gpu.ecc, gpu.ecc_prev, ecc_limits), gpu.ecc_t)
    if gpu.nvlink_prev is not None:
        rate = counter_rate(gpu.nvlink_hist, gpu.nvlink_prev, cfg.rate_window_s)
        rule(evaluate_error_rate(rate, cfg.nvlink_errors_per_s, gpu.nvlink_rose), gpu.nvlink_prev[0])
    if gpu.pcie_prev is not None:
        rate = counter_rate(gpu.pcie_hist, gpu.pcie_prev, cfg.rate_window_s)
        rule(evaluate_replay_rate(rate, cfg.pcie_replays_per_s), gpu.pcie_prev[0])
    return found

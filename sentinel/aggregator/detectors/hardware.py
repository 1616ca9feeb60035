"""Hardware detector: one GPU's own evidence → at most one verdict for it (faulty or degraded).

Runs on the GPUs whose hardware facts changed in the batch just applied, so a critical Xid, a lost GPU or a
pending row remap opens its verdict in the same tick the agent reported it. Pure: the GPU's state, the
thresholds and ``now`` in, findings out.
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
from sentinel.components.vocab import Action, VerdictKind, verdict_kind
from sentinel.components.vocab import Finding as RuleFinding
from sentinel.components.xid.catalog import xid_info
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
            for host, index in self.flagged:
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
            found = evaluate_gpu(gpu, detect.hardware, seen.now, detect.ecc)
            if found:
                self.flagged.add(where)
            else:
                self.flagged.discard(where)
            findings.extend(found)
        gone = {(h, i) for h, i in self.flagged if seen.fleet.gpu(h, i) is None}
        self.flagged -= gone
        return Evaluation(findings, scope=keys.__contains__)

    def host_forgotten(self, host: str) -> None:
        self.flagged = {(h, i) for h, i in self.flagged if h != host}

    def snapshot(self) -> dict[str, Any]:
        return {"flagged": sorted([h, i] for h, i in self.flagged)}


def xid_rule_meaning(reason: str) -> str:
    """``xid_79`` / ``xid_13_repeated`` → the catalog's name of the code."""
    code = reason.removeprefix("xid_").split("_", 1)[0]
    return xid_info(int(code)).name if code.isdigit() else reason


def gpu_key(host: str, gpu: int) -> tuple[str, ...]:
    return ("hw", host, str(gpu))


def evaluate_gpu(
    gpu: GpuView, cfg: HardwareConfig, now: float, ecc_limits: EccThresholds | None = None
) -> list[Finding]:
    """Every hardware problem of ``gpu`` that is true now (the book merges them into one verdict)."""
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
        add(
            kind,
            decision.reason,
            decision.action,
            decision.since if decision.since is not None else now,
            *evidence,
        )

    def rule(finding: RuleFinding | None, t: float) -> None:
        if finding is not None and finding.state != "ok":
            add(verdict_kind(finding.state), finding.reason, finding.action, t, *finding.evidence)

    rule(evaluate_state(gpu.state), gpu.state_t)  # type: ignore[arg-type]
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

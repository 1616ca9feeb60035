"""The node's fitness as the agent knows it, for ``sentinel health`` (Slurm HealthCheckProgram, prolog, epilog).

A job launcher asking "may I run here?" must get an answer even when the aggregator is away, and the answer
must be the one the aggregator would give. So the agent runs the aggregator's own pure hardware rules
(:func:`sentinel.aggregator.detectors.hardware.evaluate_gpu`: the Xid policy, row remapping, ECC, a lost or
unresponsive GPU, NVLink/PCIe error rates) over a one-host :class:`~sentinel.aggregator.state.FleetState`
fed with its own batches, and adds the verdicts on this host that the aggregator pushes back over the stream
(stuck, straggler, anything only the fleet view can see). "Could not check" is never "fit": before the GPU
source opened, or when the agent has not collected for a while, the answer is "cannot tell".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sentinel.aggregator.detectors import hardware
from sentinel.aggregator.state import FleetState, HostView
from sentinel.components.device.inventory import evaluate_source
from sentinel.components.vocab import verdict_kind
from sentinel.config.aggregator import DetectConfig
from sentinel.wire import Batch, Hello, HostVerdict, ProcInfo

#: actions that make a node unfit for new work; ``none`` and ``restart_app`` concern a job, not the node
UNFIT_ACTIONS = frozenset({"drain", "reset_gpu", "reboot", "rma"})
#: pushed verdicts kept at most (a host has one hardware verdict per GPU plus a few job ones)
MAX_PUSHED = 256
#: the answer is "cannot tell" when the last collection is older than this many ticks (and 10 s)
STALE_TICKS = 5


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a GPU (``gpu`` set) or the host is not fit, or a warning about it."""

    kind: str
    reason: str
    action: str
    source: str  # "local": the agent's own rules; "aggregator": a pushed verdict
    gpu: int | None = None
    verdict: str | None = None
    evidence: str = ""

    @property
    def unfit(self) -> bool:
        return self.action in UNFIT_ACTIONS or self.kind == "faulty"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "action": self.action,
            "source": self.source,
            "gpu": self.gpu,
            "verdict": self.verdict,
            "evidence": self.evidence,
        }


class LocalHealth:
    """The aggregator's hardware rules over this host's own batches, plus the verdicts pushed back."""

    def __init__(self, host: str, detect: DetectConfig | None = None) -> None:
        self.detect = detect or DetectConfig()
        self.fleet = FleetState(xid_config=self.detect.xid)
        self.host_name = host
        self.view: HostView | None = None
        self.pushed: list[HostVerdict] = []
        self.pushed_at: float | None = None
        self.procs: list[ProcInfo] = []

    def hello(self, hello: Hello, now: float) -> None:
        """The GPU inventory (re)opened."""
        self.view = self.fleet.hello(hello, now)

    def apply(self, batch: Batch, now: float) -> None:
        if self.view is None:
            return
        self.fleet.apply(self.view, batch, now)
        self.fleet.take_dirty()  # evaluated on demand, for every GPU
        if batch.procs is not None:
            self.procs = list(batch.procs)

    def push(self, verdicts: list[HostVerdict], now: float) -> None:
        """The aggregator's open verdicts on this host (the whole set: it replaces the last one)."""
        self.pushed = list(verdicts[:MAX_PUSHED])
        self.pushed_at = now

    def reasons(self, now: float) -> list[Reason]:
        """Every problem true now: local findings first, then pushed verdicts not already named locally."""
        out: list[Reason] = []
        source = self.view.gpu_source if self.view is not None else None
        missing = evaluate_source(source) if source is not None and source.ok else None
        if missing is not None:  # NVML works and sees fewer GPUs than the host has (the inventory rule)
            kind = verdict_kind(missing.state)
            out.append(Reason(kind, missing.reason, missing.action, "local", evidence=missing.evidence[0]))
        if self.view is not None:
            for gpu in self.view.gpus:
                for f in hardware.evaluate_gpu(gpu, self.detect.hardware, now, self.detect.ecc):
                    out.append(
                        Reason(
                            kind=f.kind,
                            reason=f.reason,
                            action=f.action,
                            source="local",
                            gpu=f.gpu,
                            evidence=f.evidence[0] if f.evidence else "",
                        )
                    )
        local = {(r.gpu, r.reason) for r in out}
        for v in self.pushed:
            if v.kind == "host_silent" or (v.gpu, v.reason) in local:
                continue  # the agent answering is its own proof of life; a local finding already says it
            out.append(
                Reason(
                    kind=v.kind,
                    reason=v.reason,
                    action=v.action,
                    source="aggregator",
                    gpu=v.gpu,
                    verdict=v.id,
                    evidence=f"job {v.job} rank {v.rank}" if v.job is not None else "",
                )
            )
        return out


def cannot_tell(opened: bool, open_error: str, last_tick: float, tick_s: float, now: float) -> str:
    """Why the agent cannot vouch for the node right now, or "" when it can."""
    if not opened:
        return f"the GPU source is not open ({open_error or 'not yet tried'})"
    stale_after = max(STALE_TICKS * tick_s, 10.0)
    if not math.isfinite(last_tick) or last_tick <= 0:
        return "the agent has not collected yet"
    age = now - last_tick
    if age > stale_after:
        return f"the agent's last collection is {age:.0f} s old"
    return ""


def report(
    health: LocalHealth,
    *,
    host: str,
    gpus: list[tuple[int, str, str]],
    why_not: str,
    now: float,
    aggregator_connected: bool,
) -> dict[str, Any]:
    """The health document the agent serves (``GET /api/v1/health``); ``fit`` is null when it cannot tell.

    ``gpus`` is (index, uuid, state) per GPU of the inventory.
    """
    if not why_not and not gpus:
        expected = health.view.gpu_source.expected if health.view and health.view.gpu_source else 0
        if not expected:  # nothing checked, and nothing said there should be: no vouching for it
            why_not = "NVML sees no GPU on this host and none is expected (collect.expected_gpus)"
    reasons = health.reasons(now) if not why_not else []
    by_gpu: dict[int, list[Reason]] = {}
    host_reasons: list[Reason] = []
    for r in reasons:
        (by_gpu.setdefault(r.gpu, []) if r.gpu is not None else host_reasons).append(r)
    pids: dict[int, list[dict[str, Any]]] = {}
    for p in health.procs:
        pids.setdefault(p.gpu, []).append({"pid": p.pid, "name": p.name, "job": p.job_id, "rank": p.rank})
    gpu_docs = []
    for index, uuid, state in gpus:
        mine = by_gpu.get(index, [])
        gpu_docs.append(
            {
                "index": index,
                "uuid": uuid,
                "state": state,
                "fit": None if why_not else not any(r.unfit for r in mine),
                "reasons": [r.to_dict() for r in mine],
                "processes": pids.get(index, [])[:64],
            }
        )
    return {
        "host": host,
        "t": now,
        "fit": None if why_not else not any(r.unfit for r in reasons),
        "cannot_tell": why_not,
        "host_reasons": [r.to_dict() for r in host_reasons],
        "gpus": gpu_docs,
        "aggregator_connected": aggregator_connected,
        "pushed_at": health.pushed_at,
    }

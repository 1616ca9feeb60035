"""The node's fitness as the agent knows it, for ``sentinel health`` (Slurm HealthCheckProgram, prolog, epilog).

A job launcher asking "may I run here?" must get an answer even when the aggregator is away, and the answer
must be the one the aggregator would give. So the agent keeps its GPUs' views as the aggregator does
(:mod:`sentinel.components.gpu_view`, fed with its own batches) and runs the same hardware judgement over them
(:func:`sentinel.components.hardware.judge_gpu`: the Xid policy, row remapping, ECC, a lost or unresponsive
GPU, NVLink/PCIe error rates), and adds the verdicts on this host that the aggregator pushes back over the stream
(stuck, straggler, anything only the fleet view can see). "Could not check" is never "fit": before the GPU
source opened, or when the agent has not collected for a while, the answer is "cannot tell".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

from sentinel.components.device.inventory import evaluate_source
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.gpu_view import (
    GpuView,
    apply_gpu_event,
    apply_sample,
    apply_xid_in_burst,
    fit_inventory,
)
from sentinel.components.hardware import judge_gpu, judge_settings
from sentinel.components.signal import JudgeSettings
from sentinel.components.vocab import verdict_kind
from sentinel.components.xid.storm import XidStorms
from sentinel.config.aggregator import DetectConfig
from sentinel.wire import Batch, Hello, HostVerdict, ProcInfo, XidOccurred

#: actions that make a node unfit for new work; ``none`` and ``restart_app`` concern a job, not the node
UNFIT_ACTIONS = frozenset({"drain", "reset_gpu", "reboot", "rma"})
#: pushed verdicts kept at most (a host has one hardware verdict per GPU plus a few job ones)
MAX_PUSHED = 256
#: the answer is "cannot tell" when the last collection is older than this many ticks (and 10 s)
STALE_TICKS = 5
#: GPUs kept per host, and how far ahead of ``now`` a stamp may be (the aggregator's defaults)
MAX_GPUS = 64
MAX_CLOCK_SKEW_S = 300.0


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


class LocalGpus:
    """This host's GPUs as its own batches describe them: the views the shared hardware judgement reads,
    updated as the aggregator's fleet state updates its views of them."""

    def __init__(self, host: str, settings: JudgeSettings) -> None:
        self.host = host
        self.settings = settings
        self.gpus: list[GpuView] = []
        self.gpu_source: GpuSourceHealth | None = None
        self.boot_id = ""
        self._dirty: list[GpuView] = []  # what the updates report changed; judged on demand instead
        #: this host's Xid bursts: a storm's echoes fail no GPU here either
        self.xid_storms = XidStorms(
            window_s=settings.xid.storm_window_s, min_gpus=settings.xid.storm_min_gpus
        )

    def hello(self, hello: Hello, now: float) -> None:
        if self.boot_id and hello.boot_id and hello.boot_id != self.boot_id:
            for gpu in self.gpus:  # a reboot clears every latched hardware fact
                gpu.clear_latches(hello.started_at or now)
                gpu.state = "ok"
        self.boot_id = hello.boot_id or self.boot_id
        fit_inventory(self.host, self.gpus, hello.gpus[:MAX_GPUS], MAX_GPUS)
        if hello.gpu_source is not None:
            self.gpu_source = hello.gpu_source

    def apply(self, batch: Batch, now: float) -> None:
        horizon = now + MAX_CLOCK_SKEW_S
        gpus, dirty = self.gpus, self._dirty
        for sample in batch.samples:
            index = sample.gpu
            if not sample.t <= horizon or not 0 <= index < MAX_GPUS:
                continue  # a year ahead (or NaN) would make every later sample look old
            while len(gpus) <= index:
                gpus.append(GpuView(host=self.host, index=len(gpus)))
            apply_sample(gpus[index], sample, now, dirty)
        for event in batch.events:
            at = event.gpu
            if at is None or not 0 <= at < len(gpus):
                continue
            # an event stamped too far ahead counts at the time it was applied (the batch itself is shipped)
            stamped = event if event.t <= horizon else msgspec.structs.replace(event, t=now)
            if isinstance(stamped, XidOccurred):
                apply_xid_in_burst(gpus[at], stamped, self.settings, dirty, storms=self.xid_storms, now=now)
            else:
                apply_gpu_event(gpus[at], stamped, self.settings, dirty)
        if batch.gpu_source is not None:
            self.gpu_source = batch.gpu_source
        dirty.clear()


class LocalHealth:
    """The shared hardware judgement over this host's own batches, plus the verdicts pushed back."""

    def __init__(self, host: str, detect: DetectConfig | None = None) -> None:
        self.detect = detect = detect or DetectConfig()
        self.settings = judge_settings(detect.hardware, detect.ecc, detect.xid)
        self.host_name = host
        self.view: LocalGpus | None = None
        self.pushed: list[HostVerdict] = []
        self.pushed_at: float | None = None
        self.procs: list[ProcInfo] = []

    def hello(self, hello: Hello, now: float) -> None:
        """The GPU inventory (re)opened."""
        if self.view is None:
            self.view = LocalGpus(self.host_name, self.settings)
        self.view.hello(hello, now)

    def apply(self, batch: Batch, now: float) -> None:
        if self.view is None:
            return
        self.view.apply(batch, now)
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
                for judged in judge_gpu(gpu, self.settings, now):
                    rule = judged.finding
                    out.append(
                        Reason(
                            kind=verdict_kind(rule.state),
                            reason=rule.reason,
                            action=rule.action,
                            source="local",
                            gpu=gpu.index,
                            evidence=rule.evidence[0] if rule.evidence else "",
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

"""The host's NVSwitch fabric as the aggregator judges it: the NVSwitch driver's SXids (what each means is
:mod:`sentinel.components.xid.sxid`'s) and the fabric manager's service state as the agent reads it.

One verdict per host and switch, never one per GPU: a fatal SXid takes the NVLink peers of every GPU on the
baseboard, so the switch is named, not its eight GPUs. What is remembered is bounded (switches per host,
non-fatal occurrences per switch) and forgotten at the host's next boot, which resets the switches. Every
GPU of a host unregistered from the fabric for a while is the host's fault too (its fabric manager did not set
up the switches), one verdict rather than one per GPU.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Final

import msgspec

from sentinel.components.fabric.record import FabricInfo, FabricManagerStatus
from sentinel.components.fabric.rule import evaluate_fabric
from sentinel.components.vocab import Finding
from sentinel.components.xid.sxid import CONTINUED, DATA, switch_finding

#: switches remembered per host (an HGX baseboard has 4, an NVL72 tray 2; a made-up address is one more)
MAX_SWITCHES: Final = 16
#: non-fatal occurrences kept per switch (the threshold can ask for no more)
MAX_NONFATAL: Final = 256


class FabricRuleConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """NVSwitch SXids and the fabric manager (docs/signals.md, "NVSwitch SXids and the fabric manager")."""

    nonfatal_sxids: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=MAX_NONFATAL,
            description="non-fatal SXids of one switch within nonfatal_window_s that make the host degraded",
        ),
    ] = 20
    nonfatal_window_s: Annotated[
        float, msgspec.Meta(gt=0, le=86400, description="the window non-fatal SXids are counted in")
    ] = 3600.0
    manager_down_after_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=86400,
            description="the fabric manager not running this long (agent time) on a host that has it makes "
            "the host faulty (a restart in progress is shorter)",
        ),
    ] = 120.0
    not_completed_after_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=86400,
            description="every GPU of a host that reports a fabric state (at least 2) not registered "
            "(not completed or failed) this long (agent time) makes the host faulty "
            "(fabric_not_completed), their GPUs' own fabric verdicts folded into it",
        ),
    ] = 120.0


@dataclass(slots=True)
class SwitchLog:
    """One switch's SXids: its first fatal one (code, agent time) and its recent non-fatal ones."""

    fatal: tuple[int, float] | None = None
    nonfatal: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_NONFATAL))


@dataclass(slots=True)
class SwitchMemory:
    """A host's switches by PCI address, as its SXid lines name them."""

    switches: dict[str, SwitchLog] = field(default_factory=dict)
    #: SXids of switches beyond :data:`MAX_SWITCHES` (not remembered, counted)
    refused: int = 0

    def note(self, switch: str, sxid: int, severity: str, reason: str | None, t: float) -> None:
        """One classified SXid line: a fatal one is remembered (the first per switch), a non-fatal one
        counted; an event's data line is nothing more, its severity line is not counted again."""
        if reason == DATA:
            return
        log = self.switches.get(switch)
        if log is None:
            if len(self.switches) >= MAX_SWITCHES:
                self.refused += 1
                return
            log = self.switches[switch] = SwitchLog()
        if severity == "critical":
            if log.fatal is None:
                log.fatal = (sxid, t)
        elif reason != CONTINUED:
            log.nonfatal.append((t, sxid))


def judge_switches(
    memory: SwitchMemory, settings: FabricRuleConfig, now: float
) -> list[tuple[str, Finding, float]]:
    """(switch, finding, evidence time) for each switch with a fatal SXid, or as many non-fatal ones of one
    code as the threshold within the window (agent time ``now``)."""
    out: list[tuple[str, Finding, float]] = []
    for switch, log in memory.switches.items():
        if log.fatal is not None:
            code, t = log.fatal
            finding = switch_finding(code, switch, "critical", 1, 1)
            if finding is not None:
                out.append((switch, finding, t))
            continue
        since = now - settings.nonfatal_window_s
        counts: dict[int, int] = {}
        first: dict[int, float] = {}
        for t, code in log.nonfatal:
            if t >= since:
                counts[code] = counts.get(code, 0) + 1
                first.setdefault(code, t)
        if not counts:
            continue
        code = max(counts, key=lambda c: counts[c])
        finding = switch_finding(code, switch, "warning", counts[code], settings.nonfatal_sxids)
        if finding is not None:
            out.append((switch, finding, first[code]))
    return out


MANAGER_DOWN: Final = Finding(
    state="faulty",
    severity="critical",
    action="drain",
    reason="fabric_manager_down",
)


def judge_manager(
    status: FabricManagerStatus | None, settings: FabricRuleConfig, now: float
) -> Finding | None:
    """The host's finding when the fabric manager of a host that has one is not running for longer than
    ``manager_down_after_s`` (agent time ``now``)."""
    if status is None or not status.present or status.running:
        return None
    down_for = now - status.since
    if down_for < settings.manager_down_after_s:
        return None
    return MANAGER_DOWN.because(
        f"nvidia-fabricmanager is {status.state} for {down_for:.0f}s (since agent time {status.since:.0f})",
        "NVIDIA: without the fabric manager the NVSwitch fabric is not set up: new CUDA jobs fail to start "
        "(system not yet initialized) and GPUs that lose their fabric registration cannot rejoin; restart "
        "nvidia-fabricmanager (journalctl -u nvidia-fabricmanager says why it stopped)",
    )


FABRIC_NOT_COMPLETED: Final = Finding(
    state="faulty",
    severity="critical",
    action="drain",
    reason="fabric_not_completed",
)
#: GPUs reporting a fabric state a host needs before all of them failing is the host's fault, not a GPU's
MIN_FABRIC_GPUS: Final = 2


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's fabric registration as last reported and the agent time it was first reported so."""

    gpu: int
    info: FabricInfo
    t: float


def judge_host_fabric(
    gpus: list[GpuFabric], manager: FabricManagerStatus | None, settings: FabricRuleConfig, now: float
) -> tuple[Finding, float] | None:
    """(finding, since when) when every GPU of the host that reports a fabric state (``not_supported`` ones
    say nothing; at least :data:`MIN_FABRIC_GPUS`) has been unregistered for ``not_completed_after_s``
    (agent time ``now``): the fabric manager did not configure the host's switches."""
    judged = [g for g in gpus if g.info.state != "not_supported"]
    if len(judged) < MIN_FABRIC_GPUS or any(evaluate_fabric(g.info) is None for g in judged):
        return None
    since = max(g.t for g in judged)
    if now - since < settings.not_completed_after_s:
        return None
    states = ", ".join(
        f"GPU {g.gpu} {g.info.state}" + (f" (NVML error {g.info.status})" if g.info.status else "")
        for g in sorted(judged, key=lambda g: g.gpu)
    )
    if manager is None or not manager.present:
        fm = "the fabric manager's service state is not known"
    else:
        fm = f"nvidia-fabricmanager is {manager.state or ('running' if manager.running else 'not running')}"
    return FABRIC_NOT_COMPLETED.because(
        f"all {len(judged)} GPUs of the host are not registered with the NVLink fabric for "
        f"{now - since:.0f}s: {states}",
        f"{fm}; the fabric manager has not configured the host's NVSwitches: NCCL init over NVLink hangs "
        "(journalctl -u nvidia-fabricmanager says why)",
    ), since

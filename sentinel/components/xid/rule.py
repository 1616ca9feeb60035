"""Per-GPU Xid policy: a pure state machine from Xid events to ok / suspect / faulty.

* A code that is fatal by itself (catalog ``faulty_at_once``, refined by the line: a "Nonfatal" NVLink5
  event or an Xid 154 "to None" is not) makes the GPU **faulty** at once.
* Other codes are *repeatable*: one occurrence is an incident of the program that ran, but the same code
  again and again on one GPU, from different processes, within a window, points at the GPU (e.g. Xid 13
  three times in an hour from three jobs) -> **suspect**. Application-caused codes (13, 31, 43, 45) can
  reach suspect this way, never faulty.
* The state only goes up. It clears when a GPU reset or a reboot is observed (the agent sees the driver
  reload or NVML's reset), never because time passed: a GPU that fell off the bus an hour ago is no
  healthier now.

Time is always passed in (seconds, any epoch), so the agent, the aggregator and the simulator with its
virtual clock share the same code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Final

import msgspec

from sentinel.components.vocab import ACTIONS, Action, GpuHealth
from sentinel.components.xid.buckets import CLEARED_BY, resolve
from sentinel.components.xid.catalog import APPLICATION_CODES
from sentinel.components.xid.parse import XidRecord

_STATE_RANK: Final[dict[str, int]] = {"ok": 0, "suspect": 1, "faulty": 2}
_MAX_EVIDENCE: Final = 16
UNKNOWN_GPU: Final = "unknown"


class XidPolicyConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Thresholds of the Xid policy (embeddable as a TOML section of the agent/aggregator config)."""

    repeat_window_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="Window in seconds in which repeats of one Xid code on one GPU are counted. One hour: "
            "long enough to see several jobs hit the same GPU, short enough that unrelated bugs weeks apart "
            "do not add up.",
        ),
    ] = 3600.0
    repeat_threshold: Annotated[
        int,
        msgspec.Meta(
            ge=2,
            description="Occurrences of one repeatable code within the window that make the GPU suspect. "
            "Three: two can be one buggy program retried once; three different processes failing the same "
            "way on one GPU is the pattern NVIDIA's Xid 13/31 workflow treats as hardware.",
        ),
    ] = 3
    distinct_processes: Annotated[
        bool,
        msgspec.Meta(
            description="Count only occurrences from different processes (lines without a pid count "
            "individually). A single program crashing in a loop is its own bug, not the GPU's.",
        ),
    ] = True
    dedupe_window_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="Lines of the same code and process closer than this are one event: the driver prints "
            "one Xid 13 per SM and one Xid 45 per channel for a single incident.",
        ),
    ] = 1.0
    count_secondary: Annotated[
        bool,
        msgspec.Meta(
            description="Count lines that say 'caused by previous Xid N' towards repeats. Off: the primary "
            "Xid was already counted and the secondary would count the same incident twice.",
        ),
    ] = False
    extra_faulty_codes: Annotated[
        list[int],
        msgspec.Meta(
            description="Codes to treat as fatal at once in addition to sentinel's catalog (site policy, e.g. "
            "operators that reboot on Xid 44). Application-caused codes are ignored here.",
        ),
    ] = []
    ignored_codes: Annotated[
        list[int],
        msgspec.Meta(description="Codes that never change a GPU's state (known-noisy codes on a fleet)."),
    ] = []
    max_gpus: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="GPUs tracked at most; beyond this, healthy GPUs are forgotten first. Bounds memory "
            "against logs full of made-up PCI addresses.",
        ),
    ] = 1024
    max_events_per_gpu: Annotated[
        int,
        msgspec.Meta(ge=8, description="Recent events kept per GPU for repeat counting (bounds memory)."),
    ] = 1024


class XidDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The policy's view of one GPU after an observation."""

    pci_bus: str
    state: GpuHealth
    #: ``ok``, ``xid_79`` (fatal code), ``xid_13_repeated``, ``gpu_reset_observed``, ``reboot_observed``.
    reason: str
    action: Action
    evidence: tuple[str, ...] = ()
    #: True when this observation changed the state.
    changed: bool = False
    #: When the GPU entered its current state (the ``now`` of that observation).
    since: float | None = None


class XidGpuMemory(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU's policy state as it survives an aggregator restart: the latch and the repeat history."""

    pci_bus: str
    state: GpuHealth
    reason: str
    action: Action
    since: float | None = None
    evidence: list[str] = []
    events: list[tuple[float, int, int | None]] = []


class XidMemory(msgspec.Struct, kw_only=True):
    """One GPU's Xid state machine: the latch (state, reason, action, since, evidence), the repeat history
    (``events``: time, code, pid) and the codes seen since the last reset (code → first time)."""

    state: GpuHealth = "ok"
    reason: str = "ok"
    action: Action = "none"
    since: float | None = None
    evidence: list[str] = []
    events: list[tuple[float, int, int | None]] = []
    codes: dict[int, float] = {}


def observe_xid(gpu: XidMemory, record: XidRecord, now: float, cfg: XidPolicyConfig) -> bool:
    """Account for one Xid line seen at ``now`` on the GPU whose memory is ``gpu``; True when its state rose."""
    code = record.xid
    if code in cfg.ignored_codes:
        return False
    line = f"{evidence_time(now)} Xid {code}" + (f" pid={record.pid}" if record.pid is not None else "")
    line += f" ({record.process})" if record.process else ""
    if code in CLEARED_BY:
        # the condition an earlier code reported is over (Xid 162 after 163): it no longer repeats
        gone = CLEARED_BY[code]
        gpu.events[:] = [event for event in gpu.events if event[1] != gone]
    nvidia = resolve(code, record.message, other_codes=frozenset(event[1] for event in gpu.events))
    line += f" [{nvidia.evidence()}]"
    fatal = record.fatal or (code in cfg.extra_faulty_codes and code not in APPLICATION_CODES)
    if fatal:
        return _raise(
            gpu,
            state="faulty",
            reason=f"xid_{code}",
            action=record.action,
            note=f"{line}: {record.message}",
            now=now,
        )
    if record.previous_xid is not None and not cfg.count_secondary:
        return False
    _prune(gpu, now, cfg.repeat_window_s)
    for when, seen_code, pid in reversed(gpu.events):
        if seen_code == code and pid == record.pid and abs(now - when) < cfg.dedupe_window_s:
            return False
    gpu.events.append((now, code, record.pid))
    if len(gpu.events) > cfg.max_events_per_gpu:
        del gpu.events[: len(gpu.events) - cfg.max_events_per_gpu]
    count = _repeat_count(gpu, code, cfg.distinct_processes)
    if count >= cfg.repeat_threshold:
        note = f"{line}: {count} occurrences of Xid {code} within {cfg.repeat_window_s:g}s"
        if cfg.distinct_processes:
            note += " from different processes"
        return _raise(
            gpu, state="suspect", reason=f"xid_{code}_repeated", action="reset_gpu", note=note, now=now
        )
    return False


def _prune(gpu: XidMemory, now: float, window_s: float) -> None:
    horizon = now - window_s
    events = gpu.events
    cut = 0
    while cut < len(events) and events[cut][0] < horizon:
        cut += 1
    if cut:
        del events[:cut]


def _repeat_count(gpu: XidMemory, code: int, distinct_processes: bool) -> int:
    same = [(pid, index) for index, (_, seen, pid) in enumerate(gpu.events) if seen == code]
    if not distinct_processes:
        return len(same)
    return len({pid if pid is not None else f"unknown-{index}" for pid, index in same})


def _raise(gpu: XidMemory, *, state: GpuHealth, reason: str, action: Action, note: str, now: float) -> bool:
    if len(gpu.evidence) < _MAX_EVIDENCE:
        gpu.evidence.append(note)
    changed = _STATE_RANK[state] > _STATE_RANK[gpu.state]
    if changed:
        gpu.state, gpu.reason, gpu.since = state, reason, now
    if _STATE_RANK[state] >= _STATE_RANK[gpu.state] and ACTIONS.index(action) > ACTIONS.index(gpu.action):
        gpu.action = action
    return changed


def evidence_time(t: float) -> str:
    """A time for evidence read by people: UTC ``HH:MM:SS`` with the date for wall-clock times (evidence
    once showed ``t=1.79612e+09``), ``t+12.5s`` for the simulator's virtual clock."""
    if t >= 1e9:
        return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"t+{t:.1f}s"


class XidPolicy:
    """Feed it Xid records and reset/reboot observations; ask it for per-GPU decisions (GPUs keyed by PCI
    address, as kernel lines name them). The aggregator keeps one :class:`XidMemory` per GPU instead (the
    xid signal); this keyed form serves ``sentinel logs`` and the agent's own view."""

    def __init__(self, config: XidPolicyConfig | None = None) -> None:
        self.config = config or XidPolicyConfig()
        self._gpus: dict[str, XidMemory] = {}

    def observe(self, record: XidRecord, now: float) -> XidDecision:
        """Account for one Xid line seen at ``now``."""
        key = record.pci_bus or UNKNOWN_GPU
        gpu = self._gpu(key)
        changed = observe_xid(gpu, record, now, self.config)
        return decision(key, gpu, changed=changed)

    def observe_gpu_reset(self, pci_bus: str, now: float) -> XidDecision:
        """A reset of this GPU was observed: its history no longer applies."""
        gpu = self._gpu(pci_bus)
        changed = gpu.state != "ok"
        self._gpus[pci_bus] = XidMemory(reason="gpu_reset_observed", since=now)
        return decision(pci_bus, self._gpus[pci_bus], changed=changed)

    def observe_reboot(self, now: float) -> list[XidDecision]:
        """The node rebooted: every GPU starts clean."""
        decisions = []
        for key, gpu in list(self._gpus.items()):
            changed = gpu.state != "ok"
            self._gpus[key] = XidMemory(reason="reboot_observed", since=now)
            decisions.append(decision(key, self._gpus[key], changed=changed))
        return decisions

    def decision(self, pci_bus: str) -> XidDecision:
        """Current decision for one GPU (``ok`` when never seen)."""
        gpu = self._gpus.get(pci_bus)
        return decision(pci_bus, gpu if gpu is not None else XidMemory(), changed=False)

    def decisions(self) -> list[XidDecision]:
        """Current decisions for every tracked GPU."""
        return [decision(key, gpu, changed=False) for key, gpu in self._gpus.items()]

    def export(self) -> list[XidGpuMemory]:
        """Everything the policy latched and counted."""
        return [
            XidGpuMemory(
                pci_bus=key,
                state=gpu.state,
                reason=gpu.reason,
                action=gpu.action,
                since=gpu.since,
                evidence=list(gpu.evidence),
                events=list(gpu.events),
            )
            for key, gpu in self._gpus.items()
        ]

    def load(self, items: list[XidGpuMemory]) -> None:
        """Take back an :meth:`export` (a latched GPU stays latched across a restart), within the bounds."""
        for item in items[-self.config.max_gpus :]:
            gpu = self._gpu(item.pci_bus)
            gpu.state, gpu.reason, gpu.action, gpu.since = item.state, item.reason, item.action, item.since
            gpu.evidence = list(item.evidence[:_MAX_EVIDENCE])
            gpu.events = list(item.events[-self.config.max_events_per_gpu :])

    def _gpu(self, key: str) -> XidMemory:
        gpu = self._gpus.get(key)
        if gpu is None:
            if len(self._gpus) >= self.config.max_gpus:
                self._forget_one()
            gpu = self._gpus[key] = XidMemory()
        return gpu

    def _forget_one(self) -> None:
        for key, gpu in self._gpus.items():
            if gpu.state == "ok":
                del self._gpus[key]
                return
        del self._gpus[next(iter(self._gpus))]


def decision(key: str, gpu: XidMemory, *, changed: bool) -> XidDecision:
    return XidDecision(
        pci_bus=key,
        state=gpu.state,
        reason=gpu.reason,
        action=gpu.action,
        evidence=tuple(gpu.evidence),
        changed=changed,
        since=gpu.since,
    )

"""Per-GPU Xid policy: a pure state machine from Xid events to ok / suspect / faulty.

* A code that is fatal by itself (catalog ``faulty_at_once``, refined by the line: a "Nonfatal" NVLink5
  event or an Xid 154 "to None" is not) makes the GPU **faulty** at once.
* Other codes are *repeatable*: one occurrence is an incident of the program that ran, but the same code
  again and again on one GPU, from different processes, within a window, points at the GPU (e.g. Xid 13
  three times in an hour from three jobs) -> **suspect**. Application-caused codes (13, 31, 43, 45) can
  reach suspect this way, never faulty.
* The state only goes up. It clears when a GPU reset or a reboot is observed (the agent sees the driver
  reload or NVML's reset), never because time passed: a GPU that fell off the bus an hour ago is no
  healthier now. The one exception is a paired code: Xid 162 (power smoothing re-engaged) closes the
  warning its Xid 163 (disengaged) opened.
* A fatal code that comes back on the same GPU after a reset, within ``recurrence_window_s``, is the GPU's
  own: the reset did not cure it -> **faulty** with action ``rma`` and the history (occurrences, resets) as
  evidence (NVIDIA: investigate, RMA). The history survives the reset that clears the latch.
* A storm's echo (:mod:`~sentinel.components.xid.storm`) is counted and noted, never judged.

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
#: occurrences and resets a GPU's recurrence history keeps
_MAX_HISTORY: Final = 16
#: codes counted per GPU at most (a flood of made-up codes cannot grow the map)
_MAX_CODES: Final = 64
#: codes that open a warning until their pair clears it (163, cleared by 162)
OPENS_UNTIL_CLEARED: Final = frozenset(CLEARED_BY.values())
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
    recurrence_window_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="A fatal Xid that comes back on the same GPU after a GPU reset, within this many "
            "seconds of its earlier occurrence, escalates to rma with the history as evidence (NVIDIA: "
            "investigate, RMA): the reset did not cure it. Seven days: a board that fails the same way again "
            "within a week of its reset is not cured by resets. 0: never.",
        ),
    ] = 7 * 86400.0
    storm_window_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=600,
            description="Xid reports of one job (else one host) closer than this to each other are one burst: "
            "its origin (the first report of the strongest kind) is judged; the application reports on its "
            "other GPUs are the origin's echoes and are not, nor are the sympathetic ones after their own "
            "host's first hardware report. Ten seconds: a job's teardown reaches every GPU within a few.",
        ),
    ] = 10.0
    storm_min_gpus: Annotated[
        int,
        msgspec.Meta(
            ge=2,
            description="GPUs a burst must reach to be a storm: one informational verdict and one incident "
            "naming its origin and counting its GPUs and hosts.",
        ),
    ] = 4


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
    (``events``: time, code, pid), the codes seen since the last reset (code → first time) and how often
    (``counts``, a flood's repeats included), the storm echoes seen (``sympathetic``), and what a reset does
    not clear: the fatal occurrences (``history``: time, code) and the resets (``resets``) within the
    recurrence window."""

    state: GpuHealth = "ok"
    reason: str = "ok"
    action: Action = "none"
    since: float | None = None
    evidence: list[str] = []
    events: list[tuple[float, int, int | None]] = []
    codes: dict[int, float] = {}
    counts: dict[int, int] = {}
    sympathetic: int = 0
    history: list[tuple[float, int]] = []
    resets: list[float] = []


def count_xid(gpu: XidMemory, code: int, t: float, count: int = 1) -> None:
    """Note ``count`` occurrences of ``code`` (bounded: at most ``_MAX_CODES`` codes per GPU)."""
    if code in gpu.counts or len(gpu.counts) < _MAX_CODES:
        gpu.codes.setdefault(code, t)
        gpu.counts[code] = gpu.counts.get(code, 0) + count


def observe_sympathetic(gpu: XidMemory, record: XidRecord, now: float, origin: str, count: int = 1) -> None:
    """A storm's echo on this GPU: counted and noted once, never judged (it is ``origin``'s error)."""
    count_xid(gpu, record.xid, now, count)
    gpu.sympathetic += count
    if gpu.sympathetic == count and len(gpu.evidence) < _MAX_EVIDENCE:
        gpu.evidence.append(f"{evidence_time(now)} Xid {record.xid}: an echo of {origin}, not judged here")


def reset_memory(gpu: XidMemory, t: float) -> XidMemory:
    """The memory after a GPU reset at ``t``: the latch cleared — unless the GPU already went to rma for a
    recurring Xid, which no reset cures —, the recurrence history kept (the latest ``_MAX_HISTORY``
    occurrences and resets; the window applies when a code comes back)."""
    if gpu.state == "faulty" and gpu.action == "rma" and gpu.reason.endswith("_recurring"):
        return gpu
    if not gpu.history:
        return XidMemory(reason="gpu_reset_observed", since=t)
    resets = gpu.resets[-_MAX_HISTORY:]
    if not resets or t - resets[-1] >= 1.0:  # one reset seen twice (NVML's answer and the reinit) is one
        resets = [*resets[-(_MAX_HISTORY - 1) :], t]
    return XidMemory(
        reason="gpu_reset_observed", since=t, history=list(gpu.history[-_MAX_HISTORY:]), resets=resets
    )


def observe_xid(gpu: XidMemory, record: XidRecord, now: float, cfg: XidPolicyConfig) -> bool:
    """Account for one Xid line seen at ``now`` on the GPU whose memory is ``gpu``; True when its state rose."""
    code = record.xid
    if code in cfg.ignored_codes:
        return False
    line = f"{evidence_time(now)} Xid {code}" + (f" pid={record.pid}" if record.pid is not None else "")
    line += f" ({record.process})" if record.process else ""
    if code in CLEARED_BY:
        # the condition an earlier code reported is over (Xid 162 after 163): it no longer repeats, and the
        # warning it opened closes
        gone = CLEARED_BY[code]
        gpu.events[:] = [event for event in gpu.events if event[1] != gone]
        if gpu.reason == f"xid_{gone}" and gpu.state == "suspect":
            gpu.state, gpu.reason, gpu.action, gpu.since = "ok", "ok", "none", now
            if len(gpu.evidence) < _MAX_EVIDENCE:
                gpu.evidence.append(f"{line}: clears Xid {gone}")
            return False
    nvidia = resolve(code, record.message, other_codes=frozenset(event[1] for event in gpu.events))
    line += f" [{nvidia.evidence()}]"
    fatal = record.fatal or (code in cfg.extra_faulty_codes and code not in APPLICATION_CODES)
    if fatal:
        recurred = _recurrence(gpu, code, now, cfg.recurrence_window_s)
        if len(gpu.history) >= _MAX_HISTORY:
            del gpu.history[0]
        gpu.history.append((now, code))
        if recurred:
            return _raise(
                gpu,
                state="faulty",
                reason=f"xid_{code}_recurring",
                action="rma",
                note=f"{line}: {record.message}; {recurred}",
                now=now,
            )
        return _raise(
            gpu,
            state="faulty",
            reason=f"xid_{code}",
            action=record.action,
            note=f"{line}: {record.message}",
            now=now,
        )
    if code in OPENS_UNTIL_CLEARED:
        return _raise(gpu, state="suspect", reason=f"xid_{code}", action=record.action, note=line, now=now)
    if record.previous_xid is not None and not cfg.count_secondary:
        return False
    _prune(gpu, now, cfg.repeat_window_s)
    for when, seen_code, pid in reversed(gpu.events):
        if now - when >= cfg.dedupe_window_s:
            break  # events are kept in time order: nothing older is within the dedupe window
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


def _recurrence(gpu: XidMemory, code: int, now: float, window_s: float) -> str:
    """The history that makes this occurrence of ``code`` a recurrence ("" when it is not): an earlier one
    on this GPU within ``window_s``, and a reset of the GPU between the two."""
    earlier = [when for when, seen in gpu.history if seen == code and now - when <= window_s]
    if not earlier:
        return ""
    resets = [when for when in gpu.resets if earlier[0] < when <= now]
    if not resets:
        return ""
    times = ", ".join(evidence_time(when) for when in earlier)
    reset_times = ", ".join(evidence_time(when) for when in resets)
    return (
        f"Xid {code} came back after {len(resets)} GPU reset{'s' if len(resets) > 1 else ''} "
        f"(Xid {code} at {times}; reset at {reset_times}): the reset does not cure it, NVIDIA: investigate, RMA"
    )


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
        self._gpus[pci_bus] = reset_memory(gpu, now)
        return decision(pci_bus, self._gpus[pci_bus], changed=changed)

    def observe_reboot(self, now: float) -> list[XidDecision]:
        """The node rebooted: every GPU starts clean."""
        decisions = []
        for key, gpu in list(self._gpus.items()):
            changed = gpu.state != "ok"
            self._gpus[key] = msgspec.structs.replace(reset_memory(gpu, now), reason="reboot_observed")
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

"""One GPU as its agent's batches describe it: :class:`GpuView` and how a sample or an event updates it.

The aggregator's fleet state holds one per GPU of the fleet; the agent's ``sentinel health`` holds one per GPU
of its own host. Both update it here, through the registry's GPU signals (each keeps its memory by name in
``GpuView.memory``), so the hardware judgement (:mod:`sentinel.components.hardware`) sees the same facts in
either daemon. Pure: no I/O, times are the agent's clock, ``now`` is the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from sentinel.components.clocks.record import POWER_REASONS, THERMAL_REASONS, ClockViolations
from sentinel.components.clocks.rule import violation_shares
from sentinel.components.device.signal import slow_reading
from sentinel.components.pcie.record import PcieLink
from sentinel.components.registry import GPU_SIGNALS
from sentinel.components.signal import JudgeSettings
from sentinel.components.xid.rule import XidMemory, observe_sympathetic
from sentinel.components.xid.storm import XidStorms
from sentinel.wire import Event, GpuInfo, GpuSample, GpuStateChanged, GpuWasReset, XidOccurred

#: the GPU signals that remember samples and those that take events, in registry order
SAMPLED = tuple(s for s in GPU_SIGNALS if s.remember is not None)
EVENTED = tuple(s for s in GPU_SIGNALS if s.on_event is not None)
#: the xid signal's name: its memory in ``GpuView.memory``
XID = "xid"
RESETTING = tuple(s for s in SAMPLED if s.shows_reset is not None)
#: a sample with none of the slow-tick signals' fields (most samples: fast ticks) goes only to the signals
#: whose readings ride on every tick
EVERY_TICK = tuple(s for s in SAMPLED if s.every_tick)
SLOW_FIELDS = tuple(sorted({f for s in SAMPLED if not s.every_tick for f in s.reads}))
_slow_values = attrgetter(*SLOW_FIELDS)
if not {"recovery_action", "pcie_link", "fabric"} <= set(SLOW_FIELDS):  # what slow_reading looks at
    raise ImportError("a slow reading's fields must be among the slow-tick signals' reads")
#: what ``_slow_values`` reads from a fast tick's sample
_NO_SLOW_VALUES = (None,) * len(SLOW_FIELDS)
#: (name, function) pairs of the signals above, bound once for the per-sample loop
_SAMPLED: tuple[tuple[str, Any], ...] = tuple((s.name, s.remember) for s in SAMPLED)
_EVERY_TICK: tuple[tuple[str, Any], ...] = tuple((s.name, s.remember) for s in EVERY_TICK)
_RESETTING: tuple[tuple[str, Any], ...] = tuple((s.name, s.shows_reset) for s in RESETTING)


@dataclass(slots=True)
class GpuView:
    host: str
    index: int
    uuid: str = ""
    pci_bus: str = ""
    name: str = ""
    driver: str = ""
    vbios: str = ""
    pcie_link: PcieLink | None = None  # the link as last reported (the inventory detector's capability)
    state: str = "ok"
    state_t: float = 0.0  # agent time the current state was first reported
    t: float = -math.inf  # agent time of the latest sample
    seen_at: float = -math.inf
    util: float | None = None
    temp: float | None = None
    power: float | None = None
    sm_clock: float | None = None
    #: the clock-event reasons of the latest sample (an empty tuple, not the sample's empty list: a list per
    #: GPU kept alive for a second is work for every young garbage collection)
    throttle: Sequence[str] = ()
    ema_clock: float | None = None
    ema_util: float | None = None
    ema_temp: float | None = None
    ema_power: float | None = None
    ema_thermal: float = 0.0
    ema_power_cap: float = 0.0
    violations: ClockViolations | None = None  # latest cumulative clock-policy violation time
    #: policy → share of the interval between the last two violation readings it held the clocks back
    violation_share: dict[str, float] = field(default_factory=dict)
    violation_span_s: float = 0.0
    #: each GPU signal's memory by signal name (``sentinel.components.registry``): its latest reading and what
    #: its judge needs of earlier ones (the reading before a change, a counter history, the Xid latch)
    memory: dict[str, Any] = field(default_factory=dict)
    job: str | None = None
    rank: int | None = None
    last_job: str | None = None  # kept when the process goes away with the GPU, for the verdict
    last_rank: int | None = None
    reset_t: float = -math.inf
    dirty: bool = False
    #: agent time of the host's latest batch while the hardware judgement looks at this GPU
    reported_until: float = -math.inf

    @property
    def xid_key(self) -> str:
        """The GPU's key in kernel lines (its PCI address)."""
        return self.pci_bus or f"gpu-index:{self.index}"

    def clear_latches(self, t: float) -> None:
        """A GPU reset or reboot was observed: what was latched is no longer evidence (each signal says what
        of its memory a reset keeps)."""
        memory = self.memory
        for signal in GPU_SIGNALS:
            kept = memory.get(signal.name)
            if kept is None:
                continue
            if signal.on_reset is None:
                continue
            after = signal.on_reset(kept, t)
            if after is None:
                del memory[signal.name]
            else:
                memory[signal.name] = after
        self.reset_t = t
        self.dirty = True


def fit_inventory(host: str, gpus: list[GpuView], infos: list[GpuInfo], max_gpus: int) -> None:
    """The host's GPU list after a hello's inventory: grown to the highest index, a slot holding a different
    board (another UUID) started over, every GPU's identity as reported."""
    by_index = {g.index: g for g in infos if 0 <= g.index < max_gpus}
    count = max(by_index, default=-1) + 1
    while len(gpus) < count:
        gpus.append(GpuView(host=host, index=len(gpus)))
    for index, info in by_index.items():
        view = gpus[index]
        if view.uuid and view.uuid != info.uuid:  # a different board in this slot: start over
            gpus[index] = view = GpuView(host=host, index=index)
        view.uuid, view.pci_bus, view.name = info.uuid, info.pci_bus, info.name
        view.driver, view.vbios = info.driver, info.vbios


def apply_sample(gpu: GpuView, s: GpuSample, now: float, dirty_gpus: list[GpuView]) -> bool:
    """Fold one sample into ``gpu`` (appended to ``dirty_gpus`` when its hardware facts changed); True when
    it changed the GPU's PCIe link as reported (the host's inventory).

    The aggregator runs this for every GPU of the fleet every second: locals over attribute reads, the
    signals' (name, remember) pairs bound once, the slow-tick test as one tuple comparison."""
    t = s.t
    if t < gpu.t:
        return False  # an old sample from a spooled backlog: history only, the present is already known
    gpu.t = t
    gpu.seen_at = now
    state = s.state
    if state != gpu.state:
        previous = gpu.state
        gpu.state = state
        gpu.state_t = t
        gpu.dirty = True
        if state == "ok" and previous == "lost":
            gpu.clear_latches(t)  # a lost GPU answering again has been reset
    if state != "ok":
        if gpu.dirty:
            dirty_gpus.append(gpu)
        return False
    util, clock, temp, power = s.util_gpu_pct, s.sm_clock_mhz, s.temp_c, s.power_w
    gpu.util, gpu.temp, gpu.power, gpu.sm_clock = util, temp, power, clock
    throttle = s.throttle
    gpu.throttle = throttle if throttle else ()
    # moving averages with a fixed weight per sample (agents sample at a fixed tick)
    if clock is not None:
        ema = gpu.ema_clock
        gpu.ema_clock = clock if ema is None else ema + 0.2 * (clock - ema)
    if util is not None:
        ema = gpu.ema_util
        gpu.ema_util = util if ema is None else ema + 0.2 * (util - ema)
    if temp is not None:
        ema = gpu.ema_temp
        gpu.ema_temp = temp if ema is None else ema + 0.2 * (temp - ema)
    if power is not None:
        ema = gpu.ema_power
        gpu.ema_power = power if ema is None else ema + 0.2 * (power - ema)
    if throttle:
        thermal = 1.0 if THERMAL_REASONS.intersection(throttle) else 0.0
        capped = 1.0 if POWER_REASONS.intersection(throttle) else 0.0
        gpu.ema_thermal += 0.2 * (thermal - gpu.ema_thermal)
        gpu.ema_power_cap += 0.2 * (capped - gpu.ema_power_cap)
    elif gpu.ema_thermal or gpu.ema_power_cap:
        gpu.ema_thermal = 0.0 if gpu.ema_thermal < 1e-3 else gpu.ema_thermal * 0.8
        gpu.ema_power_cap = 0.0 if gpu.ema_power_cap < 1e-3 else gpu.ema_power_cap * 0.8
    link_changed = False
    memory = gpu.memory
    if _slow_values(s) != _NO_SLOW_VALUES:  # (a slow reading carries one of SLOW_FIELDS)
        if s.pcie_link != gpu.pcie_link and slow_reading(s):
            link_changed = True
            gpu.pcie_link = s.pcie_link
        for name, shows_reset in _RESETTING:
            kept = memory.get(name)
            if kept is not None and shows_reset(kept, s):
                gpu.clear_latches(t)  # e.g. volatile ECC counters restart only at a reset / driver reload
                break
        signals = _SAMPLED
    else:
        signals = _EVERY_TICK
    for name, remember in signals:
        remembered = remember(memory.get(name), s)
        if remembered is not None:
            memory[name], changed = remembered
            if changed:
                gpu.dirty = True
    violations = s.violations
    if violations is not None and violations is not gpu.violations:
        before = gpu.violations
        if before is not None and violations.reference_us > before.reference_us:
            gpu.violation_share = violation_shares(before, violations)
            gpu.violation_span_s = (violations.reference_us - before.reference_us) / 1e6
        gpu.violations = violations
    if gpu.dirty:
        dirty_gpus.append(gpu)
    return link_changed


def apply_xid_in_burst(
    gpu: GpuView,
    event: XidOccurred,
    settings: JudgeSettings,
    dirty_gpus: list[GpuView],
    *,
    storms: XidStorms,
    now: float,
) -> None:
    """An Xid on ``gpu``, seen among its job's (else its host's) other Xids: judged by the xid signal, unless
    it is the echo of another GPU's error in the same burst (:mod:`sentinel.components.xid.storm`)."""
    if event.t < gpu.reset_t:
        return
    job = gpu.job if gpu.job is not None else gpu.last_job
    scope = f"job:{job}" if job is not None else f"host:{gpu.host}"
    role, burst = storms.observe(
        scope, job, host=gpu.host, gpu=gpu.index, code=event.record.xid, t=event.t, now=now
    )
    if role != "sympathetic":
        apply_gpu_event(gpu, event, settings, dirty_gpus)
        return
    memory = gpu.memory.get(XID)
    if not isinstance(memory, XidMemory):
        memory = gpu.memory[XID] = XidMemory()
    origin = burst.echoed(gpu.host, event.record.xid)
    observe_sympathetic(
        memory, event.record, event.t, f"{origin.host} GPU {origin.gpu} Xid {origin.code}", event.count
    )


def apply_gpu_event(gpu: GpuView, event: Event, settings: JudgeSettings, dirty_gpus: list[GpuView]) -> None:
    """Apply one event about ``gpu`` (an Xid, an NVML state change, a reset); other events are not its."""
    match event:
        case XidOccurred():
            if event.t < gpu.reset_t:
                return
            for signal in EVENTED:  # the xid signal's state machine
                remembered = signal.on_event(gpu.memory.get(signal.name), event, settings)  # type: ignore[misc]
                if remembered is not None:
                    gpu.memory[signal.name], changed = remembered
                    gpu.dirty = gpu.dirty or changed
            if gpu.dirty:
                dirty_gpus.append(gpu)
        case GpuStateChanged(state="lost" | "unresponsive" as state):
            if gpu.state != state:
                gpu.state, gpu.state_t = state, event.t
            gpu.dirty = True
            dirty_gpus.append(gpu)
        case GpuWasReset() | GpuStateChanged(state="ok", previous="lost"):
            # real evidence of a reset: the agent saw one, or a lost GPU (which only a reset brings back)
            # answers again. A GPU that merely stalled (unresponsive -> ok) keeps its latched Xids.
            gpu.state, gpu.state_t = "ok", event.t
            gpu.clear_latches(event.t)
            dirty_gpus.append(gpu)
        case GpuStateChanged(state="ok"):
            gpu.state, gpu.state_t = "ok", event.t
            gpu.dirty = True
            dirty_gpus.append(gpu)
        case _:
            pass

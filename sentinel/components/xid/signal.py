"""The xid signal: its state machine per GPU (:func:`~sentinel.components.xid.rule.observe_xid`) fed by the
Xid events the agent classified, latched until a reset, judged into one finding naming the Xid."""

from __future__ import annotations

from sentinel.components.device.rule import evaluate_state
from sentinel.components.signal import GpuFacts, Judged, JudgeSettings, Signal
from sentinel.components.vocab import Finding, Severity, worse_action
from sentinel.components.xid import metrics
from sentinel.components.xid.catalog import GPU_LOST_CODES, xid_info
from sentinel.components.xid.parse import parse_xid
from sentinel.components.xid.rule import XidMemory, count_xid, observe_xid, reset_memory
from sentinel.wire import Event, XidOccurred

#: the kernel's announcements of what the row-remap counters say precisely: the rowremap signal's finding
#: names them when its reading shows the remap
REMAP_REASONS = frozenset({"xid_63", "xid_64", "xid_63_repeated", "xid_64_repeated"})


def on_event(
    memory: XidMemory | None, event: Event, settings: JudgeSettings
) -> tuple[XidMemory, bool] | None:
    if not isinstance(event, XidOccurred):
        return None
    gpu = memory if memory is not None else XidMemory()
    observe_xid(gpu, event.record, event.t, settings.xid)
    count_xid(gpu, event.record.xid, event.t, event.count)
    return gpu, True


def on_reset(memory: XidMemory, t: float) -> XidMemory:
    return reset_memory(memory, t)


def rule_meaning(reason: str) -> str:
    """``xid_79`` / ``xid_13_repeated`` → the catalog's name of the code and NVIDIA's bucket for it."""
    code = reason.removeprefix("xid_").split("_", 1)[0]
    if not code.isdigit():
        return reason
    info = xid_info(int(code))
    return f"{info.name}, NVIDIA {info.bucket}" if info.bucket else info.name


def explains_lost(memory: XidMemory | None) -> bool:
    """A latched fatal Xid that says the driver lost the GPU (79) is the cause a lost GPU's verdict names;
    NVML's lost state is its symptom. Another fatal Xid (a double-bit error) does not explain it."""
    return memory is not None and memory.state == "faulty" and not GPU_LOST_CODES.isdisjoint(memory.codes)


def judge(gpu: GpuFacts, memory: XidMemory | None, settings: JudgeSettings, now: float) -> list[Judged]:
    if memory is None or memory.state == "ok":
        return []
    remap = gpu.memory.get("rowremap")
    reading = remap.cur if remap is not None else None
    if reading is not None and (reading.pending or reading.failure) and memory.reason in REMAP_REASONS:
        return []
    codes = ", ".join(
        f"Xid {code}" + (f" x{memory.counts[code]}" if memory.counts.get(code, 1) > 1 else "")
        for code in sorted(memory.codes)
    )
    evidence = [f"{memory.reason} ({rule_meaning(memory.reason)}); seen since the last reset: {codes}"]
    evidence += memory.evidence[-3:]
    action = memory.action
    t = memory.since if memory.since is not None else now
    if gpu.state == "lost" and explains_lost(memory):
        # the Xid is the cause, the lost state its symptom: one verdict named by the Xid
        lost = evaluate_state("lost")
        assert lost is not None
        evidence += lost.evidence
        action = worse_action(action, lost.action)
        t = min(t, gpu.state_t)
    severity: Severity = "critical" if memory.state == "faulty" else "warning"
    finding = Finding(
        state=memory.state, severity=severity, action=action, reason=memory.reason, evidence=tuple(evidence)
    )
    return [Judged(finding, t)]


SIGNAL = Signal[XidMemory](
    name="xid",
    summary="Xid events from NVML and the kernel log, merged; severity and action from the one catalog",
    collector="xid",
    parse=parse_xid,
    memory_type=XidMemory,
    on_event=on_event,
    on_reset=on_reset,
    judge=judge,
    precedence=0,
    render=metrics.render,
)

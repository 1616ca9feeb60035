"""The Signal contract: one signal's whole life, declared once, in its component folder.

A :class:`Signal` says what the signal is (name, summary), where its reading comes from (its NVML read, its
text parser, or a host-level source's collector: ``collect``), how a reading is remembered on the
aggregator (``remember``: the previous reading, a counter history — the signal's own ``memory`` type, a
msgspec struct, so the fleet's latches store it generically), how the remembered readings are judged
(``judge``: pure, findings with severity and action from :mod:`sentinel.components.vocab`; a host-level
source's ``judge_host`` / ``stall_evidence``), and which metric families, alert rules and dashboard panels
it has. :mod:`sentinel.components.registry` lists every signal once; the agent's NVML reads,
its collectors, the aggregator's hardware detector, the configuration's names and the docs are derived from
it. Nothing here imports the agent or the aggregator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sentinel.components.collector import Collector
from sentinel.components.ecc.rule import EccThresholds
from sentinel.components.exposition import MetricsView, Writer
from sentinel.components.nvml_read import FieldAnswers, FieldRequest, Get
from sentinel.components.vocab import Action, Finding, VerdictKind
from sentinel.components.xid.rule import XidPolicyConfig
from sentinel.wire import Event, GpuSample

M = TypeVar("M")


def reading(sample: GpuSample, key: str) -> float | None:
    """A signal's number ``key`` (``<signal>.<name>``) in ``sample`` (None: not read this tick)."""
    return sample.readings.get(key) if sample.readings is not None else None


def put_reading(sample: GpuSample, key: str, value: float | None) -> None:
    """Put a signal's number ``key`` (``<signal>.<name>``) into ``sample`` (None: nothing to put)."""
    if value is None:
        return
    if sample.readings is None:
        sample.readings = {}
    sample.readings[key] = value


@dataclass(frozen=True, slots=True)
class SlowRead:
    """What a signal's slow NVML read gets: the call convention, the GPU, its handle, its NVLinks, and the
    answers of the GPU's one batched field-values call (every signal's ``nvml_fields``)."""

    get: Get
    gpu: int
    handle: Any
    links: Sequence[int]
    values: FieldAnswers


@dataclass(frozen=True, slots=True)
class NvmlRead:
    """A signal's NVML read, run by the agent's GPU source in registry order.

    ``fast`` fills the sample every tick, ``slow`` on slow ticks; ``fields`` names the field values the
    signal needs (given the GPU's NVLinks), asked in one ``nvmlDeviceGetFieldValues`` call per GPU.
    """

    fast: Callable[[Get, int, Any, GpuSample], None] | None = None
    slow: Callable[[SlowRead, GpuSample], None] | None = None
    fields: Callable[[Sequence[int]], list[FieldRequest]] | None = None


class GpuFacts(Protocol):
    """What a judge may read of its GPU besides its own memory: the GPU's NVML state and every signal's
    memory by name (a judge that refines another signal's finding reads that signal's memory)."""

    @property
    def state(self) -> str: ...
    @property
    def state_t(self) -> float: ...
    @property
    def t(self) -> float: ...
    @property
    def memory(self) -> dict[str, Any]: ...
    #: agent time of the host's latest batch (a lost GPU's wait for the Xid that explains it)
    @property
    def reported_until(self) -> float: ...


@dataclass(frozen=True, slots=True)
class JudgeSettings:
    """The thresholds a GPU signal's judge may use (the aggregator's ``[detect]`` sections, copied)."""

    rate_window_s: float = 60.0
    nvlink_errors_per_s: float = 1.0
    pcie_replays_per_s: float = 10.0
    lost_cause_wait_s: float = 5.0
    ecc: EccThresholds | None = None
    xid: XidPolicyConfig = field(default_factory=XidPolicyConfig)


@dataclass(frozen=True, slots=True)
class Judged:
    """One finding of a judge and the agent time of the reading that shows it (the verdict's evidence time)."""

    finding: Finding
    t: float


@dataclass(frozen=True, slots=True)
class HostJudged:
    """One finding of a host-level signal about one host: ``subject`` names what on the host it is about
    (the verdict's key after the detector and the host: a port's device and number), and the GPU and job
    rank it names when it names exactly one."""

    subject: tuple[str, ...]
    kind: VerdictKind
    reason: str
    action: Action
    evidence: tuple[str, ...]
    #: aggregator clock when the evidence appeared
    evidence_t: float
    gpu: int | None = None
    job: str | None = None
    rank: int | None = None


def judged(finding: Finding | None, t: float) -> list[Judged]:
    """A rule's answer as a judge's: nothing for no finding or an ``ok`` one."""
    return [Judged(finding, t)] if finding is not None and finding.state != "ok" else []


@dataclass(frozen=True)
class Signal(Generic[M]):
    """One signal of the registry. Every hook is optional: a host-level signal (IB ports, network
    interfaces, NCCL RAS) builds its collector (``collect``) instead of an NVML read; a GPU signal that is
    only rendered (clocks) has no judge."""

    #: the component (folder) and the signal's name: its memory's key, its docs row
    name: str
    #: one line for docs: what the signal is and what it can conclude
    summary: str
    #: the package ``sentinel.components.<component>`` it lives in (default: its name)
    component: str = ""
    #: ``gpu``: read per GPU by the agent's NVML collector and judged by the hardware detector; ``host``: a
    #: host-level source with its own collector and detector
    scope: str = "gpu"
    #: the agent's collector that reads it and the aggregator's detector that judges it (names in
    #: ``collect.disabled`` / ``detect.disabled``)
    collector: str = "nvml"
    detector: str = "hardware"
    nvml: NvmlRead | None = None
    #: a host-level source's collector, built from the agent's build context (``config``, ``host``,
    #: ``cluster``, ``sink``, ``inputs``, ``durable``; the component's builder declares what it reads as a
    #: Protocol), or None when the configuration leaves it out; the agent builds it as ``collector``
    collect: Callable[[Any], Collector | None] | None = None
    #: its text parser (``nvidia-smi -q`` text, a kernel line): text in, its record or None out
    parse: Callable[[str], Any] | None = None
    #: its memory type (a msgspec struct: stored by the fleet's latches, restored after a restart)
    memory_type: type[M] | None = None
    #: the ``GpuSample`` fields ``remember`` reads (it answers None when all of them are None); a signal
    #: whose numbers travel in ``readings`` names that field
    reads: tuple[str, ...] = ()
    #: its readings ride on every tick's sample (not only slow ticks'): a fast sample is offered to it too
    every_tick: bool = False
    #: fold one GPU sample into the memory (``None`` in: nothing remembered yet): ``(memory, changed)`` —
    #: changed when the judge must look again —, or None when the sample says nothing new to this signal.
    #: The memory is the signal's own: it may be updated in place and returned
    remember: Callable[[M | None, GpuSample], tuple[M, bool] | None] | None = None
    #: an event about its GPU (an Xid): ``(memory, changed)``, or None when the event is not this signal's
    on_event: Callable[[M | None, Event, JudgeSettings], tuple[M, bool] | None] | None = None
    #: the memory after a GPU reset or reboot observed at ``t`` (``None``: forget it); default: kept
    on_reset: Callable[[M, float], M | None] | None = None
    #: whether a sample shows this GPU was reset (counters that restart only at a reset); checked before
    #: any signal remembers the sample
    shows_reset: Callable[[M, GpuSample], bool] | None = None
    #: the findings true now, from its memory (None: nothing remembered) and the GPU's facts; pure
    judge: Callable[[GpuFacts, M | None, JudgeSettings, float], list[Judged]] | None = None
    #: a host-level signal's findings about one host from its latest reading (the aggregator's host view,
    #: read through the component's Protocol; the ``[detect]`` settings; the aggregator clock), run for
    #: every host by its ``detector``
    judge_host: Callable[[Any, Any, float], list[HostJudged]] | None = None
    #: agent time of a host's latest reading of this signal: a host judged healthy at that reading is not
    #: judged again until a new one arrives (a healthy reading cannot turn unhealthy with time alone)
    reading_t: Callable[[Any], float] | None = None
    #: evidence a host-level signal adds to a stalled job's verdict (the aggregator's job view, read
    #: through the component's Protocol; the stuck detector's settings; the aggregator clock), run by the
    #: stuck detector for every stall it names
    stall_evidence: Callable[[Any, Any, float], list[str]] | None = None
    #: on a tie of verdict kind and action between two findings of one GPU, the lower names the verdict
    precedence: int = 100
    #: its metric families on the agent's ``/metrics``
    render: Callable[[Writer, MetricsView], None] | None = None
    #: alert rules and dashboard panels generated from the same settings (``sentinel.components.alerting``)
    alerts: Callable[[Any], list[Any]] | None = None
    panels: Callable[[Any], list[Any]] | None = None

    @property
    def package(self) -> str:
        return f"sentinel.components.{self.component or self.name}"

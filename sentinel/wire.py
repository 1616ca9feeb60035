"""The one schema agent and aggregator share: every frame on the ``/api/v1/stream`` WebSocket.

Frames are msgpack-encoded msgspec Structs in binary WebSocket messages, tagged by ``type`` so one decoder
validates any frame in a single pass (malformed → :class:`msgspec.ValidationError`, which the aggregator
turns into a close code). Fields are only ever added, with defaults, so old agents keep working.

Agent → aggregator: :class:`Hello` once per connection, then :class:`Batch` frames with a per-host sequence
number that is monotonic across agent restarts (persisted next to the spool), so the aggregator can
deduplicate resent batches by (host, seq); :class:`CommandResult` answers a :class:`Command`.
Aggregator → agent: :class:`Ack` per batch, :class:`Command` (ring-buffer snapshot, job-wide FR dump).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from sentinel.components.bounds import MAX_LIST, Short
from sentinel.components.clocks.record import ClockViolations
from sentinel.components.device.record import GpuInfo, GpuSourceHealth, GpuState
from sentinel.components.ecc.record import EccCounters, RetiredPages
from sentinel.components.fabric.record import FabricInfo, FabricManagerStatus
from sentinel.components.ib.record import IbPort
from sentinel.components.nccl_debug.record import DebugReadiness
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.components.netdev.record import MAX_NETDEVS, Netdev
from sentinel.components.nvlink.record import NvLink
from sentinel.components.pcie.record import PcieLink
from sentinel.components.rowremap.record import RowRemap
from sentinel.components.vocab import Action, ReasonCode, Severity, VerdictKind
from sentinel.components.xid.parse import XidRecord
from sentinel.fr.heads import FrHeads
from sentinel.signals.record import Kind as LineKind

__all__ = [
    "EVENT_TYPES",
    "MAX_FRAME_BYTES",
    "MAX_TEXT_CHARS",
    "PROTOCOL_VERSION",
    "Ack",
    "AgentFrame",
    "AggregatorFrame",
    "Answer",
    "Batch",
    "ClockViolations",
    "Command",
    "CommandResult",
    "Drops",
    "DumpFile",
    "EccCounters",
    "Event",
    "EventEntry",
    "EvidenceAnswer",
    "EvidenceRequest",
    "FabricInfo",
    "FrDumpAnswer",
    "FrDumpRequest",
    "FrDumpWritten",
    "GpuInfo",
    "GpuSample",
    "GpuSnapshot",
    "GpuSourceHealth",
    "GpuState",
    "GpuStateChanged",
    "GpuWasReset",
    "HeadsEntry",
    "Hello",
    "KernelLine",
    "LogLine",
    "NvLink",
    "PcieLink",
    "ProcInfo",
    "ProcsEntry",
    "ProcsMap",
    "RankStack",
    "Request",
    "RetiredPages",
    "RingEntry",
    "RowRemap",
    "SampleEntry",
    "Severity",
    "Snapshot",
    "SnapshotRequest",
    "StackFrame",
    "ThreadStack",
    "VerdictsRequest",
    "XidOccurred",
    "decode_agent_frame",
    "decode_aggregator_frame",
    "encode",
]

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_TEXT_CHARS = 4096  # an event's raw text is cut to this many characters by the agent

# Hard bounds on every list, map and string of every frame, enforced by the decoder in the same single pass
# that validates the frame (the configurable ``[limits]`` of the aggregator are checked after, and are
# smaller). A frame is bounded in bytes; these bound what its bytes may expand to once decoded and kept.
MAX_BATCH_ITEMS = 1 << 18  # samples, events, procs or heads in one batch
MAX_GPUS = 1024
Text = Annotated[str, msgspec.Meta(max_length=4 * MAX_TEXT_CHARS)]

# A GPU's records are defined by its components (sentinel/components/<name>/record.py): one type on the
# wire, in the rules and in the metrics.


class GpuSample(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One GPU at one tick. Slow counters (ecc, remap, nvlink, retired) are only set on slow ticks."""

    gpu: int
    t: float
    state: GpuState = "ok"
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pstate: int | None = None
    throttle: Annotated[list[Short], msgspec.Meta(max_length=MAX_LIST)] = []  # e.g. "hw_thermal_slowdown"
    pcie_replay: int | None = None
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    recovery_action: Short | None = None  # the driver's (R550+): none, gpu_reset, node_reboot, drain_p2p, ...
    mem_temp_c: float | None = None  # HBM temperature (slow ticks)
    pcie_link: PcieLink | None = None  # generation/width now vs max (slow ticks)
    fabric: FabricInfo | None = None  # fabric-manager registration (NVSwitch systems, slow ticks)
    pids: Annotated[list[int], msgspec.Meta(max_length=MAX_LIST)] = []
    ecc: EccCounters | None = None
    remap: RowRemap | None = None
    retired: RetiredPages | None = None
    nvlink: Annotated[list[NvLink], msgspec.Meta(max_length=MAX_LIST)] | None = None
    violations: ClockViolations | None = None  # cumulative clock-policy violation time (slow ticks)
    #: numbers of the signals with no field of their own here, keyed ``<signal>.<name>``
    #: (``components/signal.py``'s ``reading``): a new signal's readings travel without a change to this
    #: struct; None on fast ticks
    readings: Annotated[dict[Short, float], msgspec.Meta(max_length=MAX_LIST)] | None = None


class _EventBase(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="kind"):
    """What every event says: when, which reader saw it, on which GPU (None: the host), how bad, its text."""

    t: float
    source: Short = ""  # nvml, kmsg, journal, log:<path>, fr, sim
    gpu: int | None = None
    severity: Severity = "info"
    text: Text = ""

    @property
    def kind(self) -> str:
        """The event's tag on the wire (``xid``, ``log``, ``gpu_state``, ``gpu_reset``, ``fr_dump``)."""
        tag = self.__struct_config__.tag
        return tag if isinstance(tag, str) else ""


class XidOccurred(_EventBase, tag="xid"):
    """A GPU raised an Xid (NVML's event set, the kernel log, or both merged).

    ``record`` is the agent's classification: the kernel line's parse (pid, process, sub-codes, MIG
    instance, severity and action refined by the line) or, for an NVML-only report, the catalog's entry.
    The aggregator judges it as sent, without reading ``text`` again.
    """

    record: XidRecord
    merged: bool = False  # NVML and the kernel log both reported it: kernel detail, NVML time
    #: occurrences this event stands for: a flood of one Xid on one GPU is coalesced by the agent into one
    #: event per window, its repeats counted here
    count: Annotated[int, msgspec.Meta(ge=1, le=2**40)] = 1


class LogLine(_EventBase, tag="log"):
    """A job or kernel log line the agent classified (the fields of docs/contracts.md §2).

    ``gpu`` is the agent's attribution (the line's PCI bus, else the GPU of the logging pid); the
    aggregator only falls back to ``pid`` against its own process map when the agent could not tell.
    """

    line_kind: LineKind = "other"
    reason: ReasonCode | None = None
    action: Action | None = None
    xid: int | None = None
    pci_bus: Short | None = None
    rank: int | None = None
    local_rank: int | None = None
    seq: int | None = None
    op: Short | None = None
    timeout_ms: int | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    peer: Short | None = None
    ran_for_ms: int | None = None
    #: an NVSwitch SXid line's code (``pci_bus`` is then the switch's address, never a GPU's)
    sxid: int | None = None


class GpuStateChanged(_EventBase, tag="gpu_state"):
    """A GPU's state as the agent reads it moved from ``previous`` to ``state`` (lost, unresponsive, ok, ...).

    ``ok`` after ``lost`` means the GPU answers again, which only a reset brings about."""

    state: GpuState
    previous: GpuState


class GpuWasReset(_EventBase, tag="gpu_reset"):
    """A GPU lost before NVML's re-initialisation answers again after it: it was reset."""


class FrDumpWritten(_EventBase, tag="fr_dump"):
    """A rank wrote a Flight Recorder dump file into the watched folder."""

    path: Short
    rank: int | None = None


#: Every event an agent sends, one tagged union (``kind``) decoded and validated with the batch.
Event = XidOccurred | LogLine | GpuStateChanged | GpuWasReset | FrDumpWritten
EVENT_TYPES: tuple[type[_EventBase], ...] = (
    XidOccurred,
    LogLine,
    GpuStateChanged,
    GpuWasReset,
    FrDumpWritten,
)


class ProcInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A process on a GPU and the job/rank it belongs to (from its environment)."""

    gpu: int
    pid: int
    name: Short = ""
    job_id: Short | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    master_addr: Short | None = None
    master_port: int | None = None
    debug: DebugReadiness | None = None  # NCCL/PyTorch async-debug readiness from the environment
    #: in uninterruptible sleep (``D`` in /proc/PID/stat) at the agent's latest reading: blocked in I/O
    #: (a hung network filesystem, storage), which the stuck detector names instead of a GPU or network fault
    blocked_io: bool = False


class Drops(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the agent had to drop since its last report (spool full, lines too long, ...)."""

    samples: int = 0
    events: int = 0
    log_lines: int = 0
    probe: int = 0  # flight-recorder heads datagrams refused or dropped


class Hello(msgspec.Struct, tag="hello", kw_only=True):
    """First frame of every connection."""

    host: Short
    protocol: int = PROTOCOL_VERSION
    cluster: Short = "default"
    agent_version: Short = ""
    boot_id: Short = ""
    started_at: float = 0.0
    tick_s: float = 1.0
    gpus: Annotated[list[GpuInfo], msgspec.Meta(max_length=MAX_GPUS)] = []
    next_seq: int = 0  # the first seq this connection will send (resends may be lower)
    gpu_source: GpuSourceHealth | None = None
    #: the agent instance whose numbering the seqs are: random, made with the agent's state directory (a
    #: wiped one starts seq again under a new id, and the aggregator starts the host's dedup window over)
    instance_id: Short = ""


class Batch(msgspec.Struct, tag="batch", kw_only=True, omit_defaults=True):
    """One tick's worth (or a spooled backlog's) of samples and events."""

    seq: int
    t: float
    samples: Annotated[list[GpuSample], msgspec.Meta(max_length=MAX_BATCH_ITEMS)] = []
    events: Annotated[list[Event], msgspec.Meta(max_length=MAX_BATCH_ITEMS)] = []
    #: None: unchanged since the last batch
    procs: Annotated[list[ProcInfo], msgspec.Meta(max_length=MAX_BATCH_ITEMS)] | None = None
    heads: Annotated[list[FrHeads], msgspec.Meta(max_length=MAX_BATCH_ITEMS)] = []
    drops: Drops | None = None
    ports: list[IbPort] | None = None  # IB/RoCE ports; None: not read this tick
    #: network interfaces (class/net statistics with rates); None: not read this tick
    netdevs: Annotated[list[Netdev], msgspec.Meta(max_length=MAX_NETDEVS)] | None = None
    ras: list[RasStatus] = []
    #: the NVSwitch fabric manager's service state; None: not read this tick (or the agent does not check)
    fabric_manager: FabricManagerStatus | None = None
    gpu_source: GpuSourceHealth | None = (
        None  # None: unchanged since the last batch  # NCCL RAS answers that arrived since the last batch
    )


class Ack(msgspec.Struct, tag="ack", kw_only=True):
    """The aggregator has durably accepted batch ``seq`` (and will drop a resend of it)."""

    seq: int


class HostVerdict(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An open verdict on the agent's own host, as the aggregator pushes it back (for ``sentinel health``)."""

    id: Short
    kind: VerdictKind
    reason: ReasonCode  # the verdict's reason code (open-ended: one per Xid, per FR analysis verdict, ...)
    action: Action
    gpu: int | None = None
    job: Short | None = None
    rank: int | None = None


# -- commands (aggregator → agent) and their answers -------------------------------------------------------

#: the largest rank number a dump may be for
MAX_RANK = 1 << 24
#: the most compressed FR dump bytes one agent's answer may carry (it must fit one frame)
MAX_FR_ANSWER_BYTES = 6 * 1024 * 1024


class _Request(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="name"):
    """What a command asks for; the agent's command table maps each type to its handler."""

    @property
    def name(self) -> str:
        """The command's name on the wire (``snapshot``, ``fr_dump``, ``verdicts``)."""
        tag = self.__struct_config__.tag
        return tag if isinstance(tag, str) else ""


class SnapshotRequest(_Request, tag="snapshot"):
    """The ring buffer from ``since`` (unix time; everything kept when absent)."""

    since: float | None = None


class FrDumpRequest(_Request, tag="fr_dump"):
    """Trigger the job's local ranks (all when ``job`` is absent) to dump their Flight Recorder; with
    ``collect``, gather the dumps written since ``since`` (waiting up to ``wait_s``, at most ``max_bytes``)."""

    job: Short | None = None
    collect: bool = False
    since: float | None = None
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 10.0
    max_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_FR_ANSWER_BYTES)] = MAX_FR_ANSWER_BYTES


class VerdictsRequest(_Request, tag="verdicts"):
    """Every open verdict on the agent's host (the whole set: it replaces the last one)."""

    verdicts: Annotated[list[HostVerdict], msgspec.Meta(max_length=MAX_LIST)] = []


#: the most bytes of evidence (stacks, kernel lines, GPU snapshots) one agent's answer may carry
MAX_EVIDENCE_BYTES = 2 * 1024 * 1024
#: how long an agent may take over one evidence answer at most
MAX_EVIDENCE_TIMEOUT_S = 120.0


class EvidenceRequest(_Request, tag="evidence"):
    """Evidence before action: the Python stacks of this host's ranks of ``job`` (or of the ranks on
    ``gpus``), the kernel log within ``window_s`` of ``fault_t`` and an ``nvidia-smi -q -x``-shaped snapshot
    of ``gpus`` (every GPU of the job's ranks when empty). The agent picks the processes itself, from its
    own job mapping: a request never names a pid. ``ranks`` narrows the stacks to those ranks."""

    job: Short | None = None
    gpus: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=MAX_GPUS)] = []
    ranks: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=1 << 14)] = []
    fault_t: float | None = None
    window_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 60.0
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_EVIDENCE_TIMEOUT_S)] = 10.0
    max_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_EVIDENCE_BYTES)] = MAX_EVIDENCE_BYTES


Request = SnapshotRequest | FrDumpRequest | VerdictsRequest | EvidenceRequest


class Command(msgspec.Struct, tag="command", kw_only=True):
    """A request from the aggregator, answered by a :class:`CommandResult` with the same ``id``."""

    id: Short
    request: Request

    @property
    def name(self) -> str:
        return self.request.name


class _Entry(msgspec.Struct, kw_only=True, tag_field="type"):
    t: float


class SampleEntry(_Entry, tag="sample"):
    data: GpuSample


class EventEntry(_Entry, tag="event"):
    data: Event


class HeadsEntry(_Entry, tag="heads"):
    data: FrHeads


class ProcsMap(msgspec.Struct, kw_only=True):
    """A process-mapping change (the ring keeps the whole map each time it changes)."""

    procs: Annotated[list[ProcInfo], msgspec.Meta(max_length=MAX_BATCH_ITEMS)]


class ProcsEntry(_Entry, tag="procs"):
    data: ProcsMap


#: one entry of the ring buffer: what the agent saw, as it sent it
RingEntry = SampleEntry | EventEntry | HeadsEntry | ProcsEntry


class _Answer(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="command"):
    """A command's answer, tagged by the command it answers."""


class Snapshot(_Answer, tag="snapshot", omit_defaults=False):
    """The host's share of the distributed flight recorder: its ring-buffer entries in ``window``
    (t0 = the oldest entry kept or the requested ``since``; t1 = the snapshot time), time-ordered."""

    host: Short
    window: tuple[float, float]
    entries: Annotated[list[RingEntry], msgspec.Meta(max_length=4 * MAX_BATCH_ITEMS)] = []


class DumpFile(msgspec.Struct, kw_only=True):
    """One rank's Flight Recorder dump, gzip bytes (``size``: the file's own size)."""

    rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANK)]
    name: Short
    size: int
    data: Annotated[bytes, msgspec.Meta(max_length=MAX_FR_ANSWER_BYTES)]


RankReasons = Annotated[dict[Short, Short], msgspec.Meta(max_length=1 << 14)]
Ranks = Annotated[list[int], msgspec.Meta(max_length=1 << 14)]


class FrDumpAnswer(_Answer, tag="fr_dump"):
    """What the agent did with its ranks' dump pipes and, when asked to collect, the dumps it found."""

    pipes: Annotated[list[Short], msgspec.Meta(max_length=1 << 14)] = []
    triggered: Ranks = []
    missing: Ranks = []  # ranks without a dump pipe
    failed: RankReasons = {}  # rank → why its pipe could not be written
    dumps: Annotated[list[DumpFile], msgspec.Meta(max_length=1 << 14)] = []
    skipped: RankReasons = {}  # rank → why its dump is not in ``dumps``
    waited_s: float = 0.0
    error: Short = ""


class StackFrame(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One Python frame of a stack: function, file and line (innermost first in :class:`ThreadStack`)."""

    name: Short
    file: Short
    line: int = 0


class ThreadStack(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One thread's Python stack as the stack reader saw it, innermost frame first."""

    thread_id: int = 0
    name: Short = ""
    active: bool = False  # running (not idle/waiting) when read
    owns_gil: bool = False
    frames: Annotated[list[StackFrame], msgspec.Meta(max_length=1024)] = []
    frames_cut: int = 0  # frames left out to keep the answer in bounds


class RankStack(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The Python stacks of one rank's process on this host (``error`` when they could not be read)."""

    pid: int
    gpu: int
    job: Short | None = None
    rank: int | None = None
    threads: Annotated[list[ThreadStack], msgspec.Meta(max_length=4096)] = []
    took_s: float = 0.0
    error: Short = ""


class KernelLine(msgspec.Struct, kw_only=True):
    """One kernel log line, stamped with the agent's clock when it was read."""

    t: float
    text: Text


class GpuSnapshot(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One GPU as ``nvidia-smi -q -x`` would print it (its ``<gpu>`` element, same element names), made
    from the agent's latest NVML reads of it (``read_at``); ``error`` when the agent has none."""

    gpu: int
    xml: Annotated[str, msgspec.Meta(max_length=256 * 1024)] = ""
    read_at: float | None = None
    error: Short = ""


class EvidenceAnswer(_Answer, tag="evidence"):
    """What an agent captured before any action on its host: ranks' stacks, kernel window, GPU snapshots.

    ``refused``: ranks named in the request that the agent does not know as ranks of a job on its GPUs
    (never read). ``cut`` lists what was left out to stay within the request's bytes or time."""

    host: Short
    t: float
    stacks: Annotated[list[RankStack], msgspec.Meta(max_length=1 << 14)] = []
    refused: RankReasons = {}
    kernel: Annotated[list[KernelLine], msgspec.Meta(max_length=1 << 14)] = []
    kernel_window: tuple[float, float] | None = None
    gpus: Annotated[list[GpuSnapshot], msgspec.Meta(max_length=MAX_GPUS)] = []
    cut: Annotated[list[Short], msgspec.Meta(max_length=MAX_LIST)] = []
    took_s: float = 0.0
    error: Short = ""


Answer = Snapshot | FrDumpAnswer | EvidenceAnswer


class CommandResult(msgspec.Struct, tag="result", kw_only=True, omit_defaults=True):
    """The agent's answer to a :class:`Command`: ``answer`` when ``ok`` (None for a command that returns
    nothing, such as ``verdicts``), else ``error``."""

    id: Short
    ok: bool = True
    error: Text = ""
    answer: Answer | None = None


AgentFrame = Hello | Batch | CommandResult
AggregatorFrame = Ack | Command

_encoder = msgspec.msgpack.Encoder()
_agent_decoder = msgspec.msgpack.Decoder(AgentFrame)
_aggregator_decoder = msgspec.msgpack.Decoder(AggregatorFrame)


def encode(frame: AgentFrame | AggregatorFrame) -> bytes:
    return _encoder.encode(frame)


def decode_agent_frame(data: bytes) -> AgentFrame:
    """Validate a frame from an agent; raises msgspec.ValidationError / DecodeError on bad input."""
    frame: AgentFrame = _agent_decoder.decode(data)
    return frame


def decode_aggregator_frame(data: bytes) -> AggregatorFrame:
    frame: AggregatorFrame = _aggregator_decoder.decode(data)
    return frame

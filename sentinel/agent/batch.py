"""The batch builder: one tick's findings → one :class:`wire.Batch`, with no I/O and no clock.

Collectors write what they found into a :class:`TickFindings` (through the agent, their sink); at the end of
the tick the daemon calls :func:`build_batch`, which fills every FR heads record with this host and the GPU
of its rank (from the process mapping), and :func:`fit_frame`, which halves heads then events until the
batch fits one WebSocket frame. Both are pure functions of their arguments, so ``sentinel sim`` (virtual
clock), ``sentinel demo`` and the daemon produce the same batches from the same readings.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import msgspec

from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.components.ib.record import IbPort
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.components.netdev.record import Netdev
from sentinel.fr.heads import FrHeads
from sentinel.wire import MAX_FRAME_BYTES, Batch, Drops, Event, GpuSample, ProcInfo, encode

#: events kept per batch at most; a log flood beyond it is counted as dropped events
MAX_EVENTS_PER_BATCH = 2000
MAX_HEADS_PER_BATCH = 4096
#: a batch must fit one WebSocket frame with room to spare
MAX_BATCH_BYTES = MAX_FRAME_BYTES * 3 // 4


@dataclass
class TickFindings:
    """What the collectors found in one tick (bounded: beyond the caps things are counted, not kept)."""

    samples: list[GpuSample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    heads: list[FrHeads] = field(default_factory=list)
    #: set when the process mapping changed this tick (``None``: unchanged, not sent)
    procs: list[ProcInfo] | None = None
    #: IB/RoCE ports when the port collector read them this tick
    ports: list[IbPort] | None = None
    #: network interfaces when the netdev collector read them this tick
    netdevs: list[Netdev] | None = None
    ras: list[RasStatus] = field(default_factory=list)
    #: the fabric manager's service state when the fabric_manager collector read it this tick
    fabric_manager: FabricManagerStatus | None = None
    #: set when the GPU source's health changed this tick
    gpu_source: GpuSourceHealth | None = None
    events_over_cap: int = 0

    def add_event(self, event: Event) -> bool:
        if len(self.events) >= MAX_EVENTS_PER_BATCH:
            self.events_over_cap += 1
            return False
        self.events.append(event)
        return True

    def add_heads(self, heads: list[FrHeads]) -> None:
        room = MAX_HEADS_PER_BATCH - len(self.heads)
        self.heads.extend(heads[: max(room, 0)])


def fill_heads(
    heads: list[FrHeads],
    *,
    host: str,
    procs: list[ProcInfo],
    gpus: Collection[int],
    note_rank: Callable[[str, int], None] | None = None,
) -> list[FrHeads]:
    """Set host, and gpu from the process mapping: by pid, else by (job, rank), else LOCAL_RANK.

    The LOCAL_RANK fallback covers ranks NVML does not list (no NVML, a pid namespace the agent cannot
    see, CPU-only jobs): launchers give local rank i the host's GPU i, so the slot is the local rank when
    this host has such a GPU. A mapping from NVML pids always wins.
    """
    if not heads:  # most ticks: the probe sends at its own, slower cadence
        return []
    by_pid = {p.pid: p for p in procs}
    by_rank = {(p.job_id, p.rank): p for p in procs if p.rank is not None}
    out: list[FrHeads] = []
    for h in heads:
        proc = by_pid.get(h.pid) if h.pid is not None else None
        if proc is None:
            proc = by_rank.get((h.job_id, h.rank))
        gpu = proc.gpu if proc is not None else h.gpu
        if gpu is None and h.local_rank is not None and h.local_rank in gpus:
            gpu = h.local_rank
        job = h.job_id or (proc.job_id if proc is not None else None)
        if job and note_rank is not None:
            note_rank(job, h.rank)
        out.append(msgspec.structs.replace(h, host=host, gpu=gpu, job_id=job))
    return out


def build_batch(
    tick: TickFindings, heads: list[FrHeads], *, seq: int, now: float, drops: Drops | None
) -> Batch:
    """The tick's batch: its samples, events, (filled) heads, the process mapping if it changed, drops."""
    return Batch(
        seq=seq,
        t=now,
        samples=tick.samples,
        events=tick.events,
        procs=tick.procs,
        heads=heads,
        drops=drops,
        ports=tick.ports,
        netdevs=tick.netdevs,
        ras=tick.ras,
        fabric_manager=tick.fabric_manager,
        gpu_source=tick.gpu_source,
    )


@dataclass(frozen=True)
class Fitted:
    batch: Batch
    data: bytes
    heads_cut: int = 0
    events_cut: int = 0


@dataclass(frozen=True)
class Encoded:
    """The msgpack of a batch's samples, events and heads, each in order, as already made (the ring buffer
    encodes every entry it keeps: :meth:`sentinel.agent.ring.RingBuffer.extend`)."""

    samples: list[bytes]
    events: list[bytes]
    heads: list[bytes]


def fit_frame(batch: Batch, max_bytes: int = MAX_BATCH_BYTES, encoded: Encoded | None = None) -> Fitted:
    """Encode; halve heads, then events, until the batch fits a frame (what goes is counted by the caller).

    ``encoded`` (the batch's parts as already encoded) is spliced into the frame as :class:`msgspec.Raw`
    instead of being encoded a second time on every tick: the frame is the same byte for byte, since msgpack
    encodes a struct alike wherever it stands.
    """
    raw: tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]] | None = None
    if encoded is not None:
        if (len(encoded.samples), len(encoded.events), len(encoded.heads)) != (
            len(batch.samples),
            len(batch.events),
            len(batch.heads),
        ):
            raise ValueError("fit_frame: the encoded parts are not the batch's")
        raw = (
            [msgspec.Raw(d) for d in encoded.samples],
            [msgspec.Raw(d) for d in encoded.events],
            [msgspec.Raw(d) for d in encoded.heads],
        )
    data = _frame(batch, raw)
    heads_cut = events_cut = 0
    while len(data) > max_bytes and (batch.heads or batch.events):
        if batch.heads:
            keep = len(batch.heads) // 2
            heads_cut += len(batch.heads) - keep
            batch = msgspec.structs.replace(batch, heads=batch.heads[:keep])
        else:
            keep = len(batch.events) // 2
            events_cut += len(batch.events) - keep
            batch = msgspec.structs.replace(batch, events=batch.events[:keep])
        data = _frame(batch, raw)
    return Fitted(batch=batch, data=data, heads_cut=heads_cut, events_cut=events_cut)


def _frame(batch: Batch, raw: tuple[list[msgspec.Raw], list[msgspec.Raw], list[msgspec.Raw]] | None) -> bytes:
    """The batch's frame; with ``raw``, its samples and the kept prefix of its events and heads spliced in."""
    if raw is None:
        return encode(batch)
    samples, events, heads = raw
    return encode(
        msgspec.structs.replace(
            batch, samples=samples, events=events[: len(batch.events)], heads=heads[: len(batch.heads)]
        )
    )

"""Where each tick's batch goes: numbered, the drops since the last one reported, kept in the ring buffer,
fitted to one frame and spooled for the shipper.

Each sample, event and head is encoded once, as its ring entry, and those bytes are spliced into the batch's
frame (:func:`~sentinel.agent.batch.fit_frame`); what does not fit a frame is cut and counted.

With ``stream.coalesce_ticks`` above 1, a routine tick (:func:`routine`) is held rather than spooled, and its
samples go out with the next batch that is: the aggregator pays its fixed cost per batch once per several
ticks. A batch is numbered only when it is spooled, so sequence numbers stay contiguous on the wire.
"""

from __future__ import annotations

from operator import attrgetter

import msgspec

from sentinel.agent.batch import MAX_BATCH_BYTES, Encoded, TickFindings, build_batch, fit_frame
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.ring import RingBuffer
from sentinel.agent.spool import SeqAllocator, Spool
from sentinel.components.gpu_view import SLOW_FIELDS
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import MAX_BATCH_ITEMS, Batch, Drops, GpuSample, ProcsMap

log = get_logger(module="agent")

#: the fields only a slow read sets: those that send a sample to the slow-tick signals, and the clock
#: violation counters (read on slow ticks, judged by no signal of their own)
SLOW_READ_FIELDS = (*SLOW_FIELDS, "violations")
_slow_read = attrgetter(*SLOW_READ_FIELDS)
_NOT_SLOW = (None,) * len(SLOW_READ_FIELDS)
#: held samples at most (items, encoded bytes): a coalesced batch stays well inside one frame and the
#: wire's per-batch item bound, whatever the host's GPU count and ``coalesce_ticks``
HELD_MAX_SAMPLES = MAX_BATCH_ITEMS // 4
HELD_MAX_BYTES = MAX_BATCH_BYTES // 4


def routine(batch: Batch) -> bool:
    """Whether a tick's batch may wait to go out with the next one.

    Routine: fast GPU samples only, every GPU in state ok, and nothing else at all (no event, FR heads,
    process map, ports, netdevs, RAS answers, fabric manager state, GPU source change or drops). A slow
    reading is a sample carrying any of :data:`SLOW_READ_FIELDS`: the fields that make the GPU view (the
    same code in the agent's health rules and the aggregator) run the slow-tick signals, which are derived
    from the signal registry so a new slow signal is covered here unchanged, plus the violation counters
    that only slow reads fill. Deciding on the batch itself, not on the GPU collector's cadence, keeps this
    a pure function of what would be sent.
    """
    if (
        batch.events
        or batch.heads
        or batch.ras
        or batch.procs is not None
        or batch.drops is not None
        or batch.ports is not None
        or batch.netdevs is not None
        or batch.fabric_manager is not None
        or batch.gpu_source is not None
    ):
        return False
    return all(s.state == "ok" and _slow_read(s) == _NOT_SLOW for s in batch.samples)


class Outbox:
    """The ring buffer, the sequence numbers and the spool of one agent, fed one batch per tick."""

    def __init__(
        self,
        ring: RingBuffer,
        seq: SeqAllocator,
        spool: Spool | None,
        counters: AgentCounters,
        *,
        coalesce_ticks: int = 1,
        held_max_bytes: int = HELD_MAX_BYTES,
    ) -> None:
        self.ring = ring
        self.seq = seq
        self.spool = spool
        self.counters = counters
        #: at most this many ticks go out in one batch (1: every tick at once)
        self.coalesce_ticks = coalesce_ticks
        self.held_max_bytes = held_max_bytes
        self._drops_reported = Drops()
        #: the routine ticks held back, oldest first: their samples and those samples' ring encodings
        self.held_ticks = 0
        self._held: list[GpuSample] = []
        self._held_encoded: list[bytes] = []
        self._held_bytes = 0

    def build(self, tick: TickFindings, heads: list[FrHeads], now: float) -> Batch:
        """This tick's batch, with the drops since the last batch (numbered by :meth:`keep` if spooled)."""
        return build_batch(tick, heads, seq=-1, now=now, drops=self._drops())

    def keep(self, batch: Batch, heads: list[FrHeads], now: float, *, final: bool = False) -> Batch | None:
        """Keep ``batch`` in the ring and spool it, with the ticks held before it; returns what was
        spooled, as it fits one frame, or None when this tick is held (``final``: never held)."""
        ring = self.ring
        encoded = Encoded(
            samples=ring.extend("sample", [(sample.t, sample) for sample in batch.samples]),
            events=ring.extend("event", [(event.t, event) for event in batch.events]),
            heads=ring.extend("heads", [(now, h) for h in heads]),
        )
        if batch.procs is not None:
            ring.append(now, "procs", ProcsMap(procs=batch.procs))
        self.counters.queue_depth["ring_entries"] = len(ring)
        if not final and self._hold(batch, encoded.samples):
            self.counters.queue_depth["held_ticks"] = self.held_ticks
            return None
        if self._held:
            batch = msgspec.structs.replace(batch, samples=self._held + batch.samples)
            encoded = Encoded(
                samples=self._held_encoded + encoded.samples, events=encoded.events, heads=encoded.heads
            )
        self._held, self._held_encoded, self._held_bytes, self.held_ticks = [], [], 0, 0
        if self.coalesce_ticks > 1:
            self.counters.queue_depth["held_ticks"] = 0
        batch.seq = self.seq.allocate()  # numbered only now that it is spooled
        fitted = fit_frame(batch, MAX_BATCH_BYTES, encoded)
        if fitted.heads_cut or fitted.events_cut:
            self.counters.drop_parts["heads_oversize"] += fitted.heads_cut
            self.counters.drop_parts["events_oversize"] += fitted.events_cut
            log.warning(
                "batch_shrunk",
                seq=batch.seq,
                bytes=len(fitted.data),
                heads=len(fitted.batch.heads),
                events=len(fitted.batch.events),
            )
        batch = fitted.batch
        if self.spool is not None:
            self.spool.add(batch, fitted.data)
            self.counters.spool_bytes = self.spool.size_bytes
            self.counters.spool_write_errors = self.spool.write_errors
            self.counters.drop_parts["spool_samples"] = self.spool.dropped_samples
            self.counters.drop_parts["spool_events"] = self.spool.dropped_events
            self.counters.queue_depth["spool_batches"] = len(self.spool)
        return batch

    def _hold(self, batch: Batch, samples: list[bytes]) -> bool:
        """Hold a routine tick while fewer than ``coalesce_ticks - 1`` are held and the held samples stay
        within their bounds; returns whether it was held."""
        if self.held_ticks >= self.coalesce_ticks - 1 or not routine(batch):
            return False
        size = sum(map(len, samples))
        if len(self._held) + len(samples) > HELD_MAX_SAMPLES or self._held_bytes + size > self.held_max_bytes:
            return False
        self._held.extend(batch.samples)
        self._held_encoded.extend(samples)
        self._held_bytes += size
        self.held_ticks += 1
        return True

    def _drops(self) -> Drops | None:
        """Drops since the last batch: the cumulative totals (also the metric) minus what was reported."""
        p = self.counters.drop_parts
        totals = Drops(
            samples=p["spool_samples"],
            events=p["spool_events"] + p["events_over_cap"] + p["events_oversize"],
            log_lines=p["log_lines_cut"] + p["log_files_refused"],
            probe=p["probe_socket"] + p["heads_oversize"],
        )
        for what in ("samples", "events", "log_lines", "probe"):
            self.counters.dropped[what] = getattr(totals, what)
        last, self._drops_reported = self._drops_reported, totals
        delta = Drops(
            samples=totals.samples - last.samples,
            events=totals.events - last.events,
            log_lines=totals.log_lines - last.log_lines,
            probe=totals.probe - last.probe,
        )
        return None if delta == Drops() else delta

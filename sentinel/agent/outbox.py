"""Where each tick's batch goes: numbered, the drops since the last one reported, kept in the ring buffer,
fitted to one frame and spooled for the shipper.

Each sample, event and head is encoded once, as its ring entry, and those bytes are spliced into the batch's
frame (:func:`~sentinel.agent.batch.fit_frame`); what does not fit a frame is cut and counted.
"""

from __future__ import annotations

from sentinel.agent.batch import MAX_BATCH_BYTES, Encoded, TickFindings, build_batch, fit_frame
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.ring import RingBuffer
from sentinel.agent.spool import SeqAllocator, Spool
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import Batch, Drops, ProcsMap

log = get_logger(module="agent")


class Outbox:
    """The ring buffer, the sequence numbers and the spool of one agent, fed one batch per tick."""

    def __init__(
        self, ring: RingBuffer, seq: SeqAllocator, spool: Spool | None, counters: AgentCounters
    ) -> None:
        self.ring = ring
        self.seq = seq
        self.spool = spool
        self.counters = counters
        self._drops_reported = Drops()

    def build(self, tick: TickFindings, heads: list[FrHeads], now: float) -> Batch:
        """This tick's batch, with the next sequence number and the drops since the last batch."""
        return build_batch(tick, heads, seq=self.seq.allocate(), now=now, drops=self._drops())

    def keep(self, batch: Batch, heads: list[FrHeads], now: float) -> Batch:
        """Keep ``batch`` in the ring and the spool; returns it as it fits one frame."""
        ring = self.ring
        encoded = Encoded(
            samples=ring.extend("sample", [(sample.t, sample) for sample in batch.samples]),
            events=ring.extend("event", [(event.t, event) for event in batch.events]),
            heads=ring.extend("heads", [(now, h) for h in heads]),
        )
        if batch.procs is not None:
            ring.append(now, "procs", ProcsMap(procs=batch.procs))
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
        self.counters.queue_depth["ring_entries"] = len(ring)
        return batch

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

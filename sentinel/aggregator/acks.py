"""Acks that promise durability: a batch is acked once what it changed is committed to the state store.

An agent deletes a batch from its spool when the ack comes and never sends it again, so an ack sent before
the batch's facts (the verdicts it opened, the latched hardware facts, the dedup window that marks it
applied) are on disk would lose them for good if the commit then failed or the process died. Each applied
batch's ack (a resend's too: the first application may not be committed yet) waits here for the next
store commit. Commits are grouped: the first ack waiting schedules one flush ``delay_s`` later, which
covers every batch of every host applied meanwhile (one transaction, no fsync of its own in WAL mode).
While the disk refuses the commit nothing is acked: the agents keep their batches spooled and resend them
on their next connection, which the dedup window applies once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

from sentinel.aggregator.store import StateStore
from sentinel.wire import Ack, encode

#: how long after the first waiting ack the group commit's flush runs (acks of this window share it)
GROUP_COMMIT_DELAY_S = 0.05
#: acks one stream may have waiting; beyond it a batch stays unacked (the agent resends it after its next
#: reconnect) rather than letting one stream grow the aggregator's memory while commits fail
MAX_WAITING_PER_STREAM = 8192


class AckSink(Protocol):
    """Where an ack goes (:class:`sentinel.aggregator.wsconn.AgentSocket`)."""

    closed: bool

    def send(self, payload: bytes) -> None: ...


class DurableAcks:
    """Acks held until the store has committed the state they cover (``store`` None: sent at once).

    Each stream's waiting acks are kept with the store generation that covers them (the next flush after
    the batch was applied: the group commit's, or the detector loop's if it comes first); a commit releases,
    in order, those it covers. A stream that ends drops its waiting acks (:meth:`forget`).
    """

    def __init__(self, store: StateStore | None, *, delay_s: float = GROUP_COMMIT_DELAY_S) -> None:
        self.store = store
        self.delay_s = delay_s
        self.sent = 0
        #: acks not kept because their stream had MAX_WAITING_PER_STREAM waiting already
        self.refused = 0
        self._by_sink: dict[AckSink, deque[tuple[int, int]]] = {}  # (generation, seq), oldest first
        self._count = 0
        self._needed = 0  # the generation the newest waiting ack needs committed
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if store is not None:
            store.on_commit = self._from_writer

    @property
    def waiting(self) -> int:
        """Acks of applied batches not yet sent (``sentinel_aggregator_acks_waiting``)."""
        return self._count

    def waiting_on(self, sink: AckSink) -> int:
        """Acks ``sink``'s stream is waiting for."""
        waiting = self._by_sink.get(sink)
        return len(waiting) if waiting is not None else 0

    def hold(self, sink: AckSink, seq: int) -> None:
        """Ack batch ``seq`` on ``sink`` once what applying it changed is committed."""
        store = self.store
        if store is None:
            self._send(sink, seq)
            return
        waiting = self._by_sink.get(sink)
        if waiting is None:
            waiting = self._by_sink[sink] = deque()
        elif len(waiting) >= MAX_WAITING_PER_STREAM:
            self.refused += 1
            return
        self._needed = store.generation + 1  # the next flush covers this batch
        waiting.append((self._needed, seq))
        self._count += 1
        if self._timer is None:
            self._loop = loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.delay_s, self._flush)

    def forget(self, sink: AckSink) -> None:
        """``sink``'s stream ended: its waiting acks are dropped (the agent resends those batches)."""
        waiting = self._by_sink.pop(sink, None)
        if waiting is not None:
            self._count -= len(waiting)

    def _flush(self) -> None:
        """The group commit: one flush for every ack that gathered; they go out when it is committed."""
        self._timer = None
        store = self.store
        if store is None or not self._by_sink:
            return
        if store.generation < self._needed:  # (a detector-loop flush since may already cover them all)
            store.flush(facts_only=True)  # may report the commit at once when there was nothing to write
        self._release(store.committed)

    def _from_writer(self, generation: int) -> None:
        """The store's writer committed ``generation`` (called on its thread)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is stopping
                loop.call_soon_threadsafe(self._release, generation)

    def _release(self, committed: int) -> None:
        for sink in list(self._by_sink):
            waiting = self._by_sink[sink]
            if sink.closed:
                self.forget(sink)
                continue
            while waiting and waiting[0][0] <= committed:
                _, seq = waiting.popleft()
                self._count -= 1
                self._send(sink, seq)
            if not waiting:
                del self._by_sink[sink]

    def _send(self, sink: AckSink, seq: int) -> None:
        if sink.closed:
            return  # gone: the agent resends it on its next connection
        try:
            sink.send(encode(Ack(seq=seq)))
        except ConnectionError:
            return
        self.sent += 1

    async def drain(self, timeout_s: float) -> bool:
        """A clean stop: commit what was applied and send the acks it covers (False: the disk did not take it
        within ``timeout_s``; those batches stay unacked and are resent to the next process)."""
        store = self.store
        if store is None:
            return True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        store.flush(facts_only=True)
        written = await asyncio.to_thread(store.wait_committed, store.generation, timeout_s)
        self._release(store.committed)
        return written

    def close(self) -> None:
        """Stop scheduling flushes (shutdown); acks still waiting are not sent, so they are resent."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._by_sink.clear()
        self._count = 0

"""The aggregator's tick loop: detectors each ``fleet.tick_s``, then the work that follows a tick.

One detector per step with the event loop resumed in between (ingest waits at most one detector's run),
then the durable store's write-behind, remediation, the verdicts pushed back to agents, the refusal
summaries and the garbage-collector maintenance that keeps full collections off the ingest path.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.goodput import GoodputLedger
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.aggregator.pushback import VerdictPush
from sentinel.aggregator.refusals import RefusalLog
from sentinel.aggregator.remediation import Remediator
from sentinel.aggregator.store import StateStore
from sentinel.config.aggregator import AggregatorConfig
from sentinel.log import get_logger
from sentinel.wire import Command


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.tick_loop")


#: CPython's third threshold while the tick loop runs: full collections only from ``_gc_maintenance``
NO_FULL_COLLECTIONS = 1 << 30
#: CPython's first threshold while the tick loop runs (its default is 700): objects that outlive a batch
#: (heads, detector memory) are walked by a young collection every ~20,000 instead of every 700, and most
#: of them are frozen (``fleet.gc_freeze_interval_s``) before a second, older-generation walk
YOUNG_COLLECTION_THRESHOLD = 20_000


@contextlib.contextmanager
def _no_automatic_full_collections(on: bool) -> Iterator[None]:
    """CPython's automatic full (generation 2) collections off and young ones less frequent, restored after
    (a daemon's lifetime; tests run many aggregators in one process). Young collections stay;
    ``fleet.gc_full_interval_s`` collects cyclic garbage at its own pace."""
    if not on:
        yield
        return
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], YOUNG_COLLECTION_THRESHOLD), old[1], NO_FULL_COLLECTIONS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


class TickLoop:
    """The background task that ticks the engine and runs what follows each tick."""

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        engine: Engine,
        metrics: AggregatorMetrics,
        refusals: RefusalLog,
        pushback: VerdictPush,
        remediator: Remediator,
        goodput: GoodputLedger,
        store: StateStore | None,
        send: Callable[[str, Command], Awaitable[bool]],
        clock: Callable[[], float],
        on_tick: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config  # replaced on reload
        self.engine = engine
        self.metrics = metrics
        self.refusals = refusals
        self.pushback = pushback
        self.remediator = remediator
        self.goodput = goodput
        self.store = store
        self._send = send
        self.clock = clock
        self.on_tick = on_tick
        self._ticker: asyncio.Task[None] | None = None
        self._next_gc_freeze = 0.0
        self._next_gc_full = 0.0

    def start(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_loop(), name="aggregator-tick")

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self.store = None

    def _gc_maintenance(self, monotonic: float) -> None:
        """Keep full garbage collections off the ingest path.

        The fleet state is hundreds of thousands of long-lived objects, and with two 24,576-rank jobs ~25,000
        heads (each with its lists) arrive every second and live two: left to CPython's thresholds, full
        collections came every few seconds at ~0.25-0.3 s each, inside whatever step was running. Every object
        is frozen (ignored by collections) each ``fleet.gc_freeze_interval_s`` (1 s), so young collections
        only see the last second's objects (engine bench: their pauses 0.19 -> 0.10 s, their CPU 2.2 -> 1.2 s
        per 30 s), CPython's own full collections are off while
        the tick loop runs (:func:`_no_automatic_full_collections`), and a full collection runs rarely, at
        a known cost (``fleet.gc_full_interval_s``).
        """
        fleet = self.config.fleet
        if fleet.gc_full_interval_s and monotonic >= self._next_gc_full:
            self._next_gc_full = monotonic + fleet.gc_full_interval_s
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        elif fleet.gc_freeze_interval_s and monotonic >= self._next_gc_freeze:
            # no collection first (one over many seconds of young objects pauses the loop): the few cycles
            # frozen with the rest are reclaimed by the next full collection
            self._next_gc_freeze = monotonic + fleet.gc_freeze_interval_s
            gc.freeze()

    async def _tick_loop(self) -> None:
        with _no_automatic_full_collections(bool(self.config.fleet.gc_full_interval_s)):
            await self._ticks()

    async def _ticks(self) -> None:
        period = self.config.fleet.tick_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        self._next_gc_freeze = loop.time() + self.config.fleet.gc_freeze_interval_s
        self._next_gc_full = loop.time() + self.config.fleet.gc_full_interval_s
        while True:
            next_at += period
            busy = 0.0
            try:
                # one detector per step, the loop resumed in between: ingest (and its hardware verdicts)
                # waits at most one detector's run, not the whole tick
                stages = self.engine.tick_stages(self.clock())
                while True:
                    started = time.perf_counter()
                    more = next(stages, None) is not None
                    busy += time.perf_counter() - started
                    if not more:
                        break
                    await asyncio.sleep(0)
            except Exception as exc:  # a detector bug must not stop detection of everything else
                log().error("tick_failed", error=f"{type(exc).__name__}: {exc}")
            self.metrics.tick_seconds.observe(busy)
            if self.store is not None:  # detector memory copied in steps ahead of the flush
                for _ in self.store.prepare():
                    await asyncio.sleep(0)
            if self.store is not None and self.store.due(loop.time()):
                self.store.flush(loop.time())
            self.remediator.tick(self.clock())
            self.goodput.tick(self.clock())
            if self.pushback.marked:
                try:
                    await self.pushback.flush(self._send)
                except Exception as exc:  # health pushback must not stop the detector loop
                    log().error("verdict_push_failed", error=f"{type(exc).__name__}: {exc}")
            self._gc_maintenance(loop.time())
            self.refusals.flush()
            if self.on_tick is not None:
                self.on_tick(self.clock())
            delay = next_at - loop.time()
            if delay < 0:
                next_at = loop.time()
                delay = 0
            await asyncio.sleep(delay)

"""The aggregator's event loop: uvloop when it is installed, the standard library's otherwise.

At 6,144 agents the aggregator's one core goes largely to the event loop itself: reading sockets, writing
acks, waking the tasks that serve each stream. uvloop (libuv) does that work in C and measurably cheaper
(see docs/aggregator.md, the capacity section); the standard loop stays fully supported and is what
``server.event_loop = "asyncio"`` (or an install without uvloop) runs. :class:`LoopErrorLimiter` is the
loop's exception handler: what the loop and aiohttp log outside our handlers, counted and rate-limited.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.log import get_logger

T = TypeVar("T")


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.loop")


def loop_factory(name: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for :func:`asyncio.run` (None: the standard loop)."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], name: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    factory = loop_factory(name)
    if factory is None:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


class LoopErrorLimiter(logging.Filter):
    """Rate-limited reporting of what the event loop and aiohttp log outside our handlers.

    An accept that fails (no file descriptors left) is retried by asyncio and logged with a traceback every
    time; under a connection flood that wrote 55 MB of log in 6 s. Each kind is counted in
    ``sentinel_aggregator_loop_errors_total`` and logged once per ``every_s`` with the count suppressed.
    Installed as the loop's exception handler and as a filter on the ``asyncio``/``aiohttp`` loggers.
    """

    LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.access")

    def __init__(
        self, metrics: AggregatorMetrics, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.metrics = metrics
        self.every_s = every_s
        self.clock = clock
        self._next: dict[str, tuple[float, int]] = {}

    def report(self, kind: str, message: str) -> bool:
        """Count one; True when it is to be logged now."""
        kind = kind[:80]
        self.metrics.loop_errors.labels(self.metrics.cluster, kind).inc()
        now = self.clock()
        until, suppressed = self._next.get(kind, (-math.inf, 0))
        if now < until:
            self._next[kind] = (until, suppressed + 1)
            return False
        if len(self._next) > 1000:
            self._next.clear()
        self._next[kind] = (now + self.every_s, 0)
        log().error("loop_error", kind=kind, message=message[:300], suppressed=suppressed)
        return True

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        kind = type(exc).__name__ if exc is not None else "loop"
        self.report(
            kind, f"{context.get('message', '')}: {exc}" if exc is not None else str(context.get("message"))
        )

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.report(record.name, record.getMessage())
        return False  # reported (or suppressed) above, in our own format

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self)
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(None)
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)

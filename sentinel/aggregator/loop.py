"""The aggregator's event loop: uvloop when it is installed, the standard library's otherwise.

At 6,144 agents the aggregator's one core goes largely to the event loop itself: reading sockets, writing
acks, waking the tasks that serve each stream. uvloop (libuv) does that work in C and measurably cheaper
(see docs/aggregator.md, the capacity section); the standard loop stays fully supported and is what
``server.event_loop = "asyncio"`` (or an install without uvloop) runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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

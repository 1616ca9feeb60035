"""Blocking GPU calls off the event loop, with deadlines, one small worker per GPU.

NVML calls can hang for minutes on a sick GPU. Each GPU gets its own daemon thread, so a hung call stalls only
that GPU; the loop waits for a result at most ``deadline`` seconds and then gives up on it. While the hung call
has not returned, the GPU is reported unresponsive and nothing new is queued to its thread (we never wait on a
hung thread, and never pile calls up behind it). Threads are daemons so a hung NVML call cannot keep the
process from exiting on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Unresponsive(Exception):
    """The call did not return within its deadline, or an earlier call on this worker still has not."""


_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class GpuWorker:
    """One daemon thread running blocking calls for one GPU, one at a time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.hung = False

    @property
    def busy(self) -> bool:
        """A call is running (after a deadline: the hung call has still not returned)."""
        return self._busy.is_set()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            fn, loop, future = job
            self._busy.set()
            try:
                result: Any = fn()
                error: BaseException | None = None
            except BaseException as exc:
                result, error = None, exc
            finally:
                self._busy.clear()
                self.hung = False
            # a closed loop (RuntimeError) means nobody waits for this result any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)

    async def call(self, fn: Callable[[], T], deadline_s: float) -> T:
        """Run ``fn`` in this worker; raise :class:`Unresponsive` when it takes longer than ``deadline_s``."""
        if self.hung and self.busy:
            raise Unresponsive(f"{self.name}: an earlier call has not returned")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, loop, future))
        try:
            # past the deadline the future is cancelled: the thread's late result finds it done (_settle)
            async with asyncio.timeout(deadline_s):
                return await future
        except TimeoutError:
            self.hung = True
            raise Unresponsive(f"{self.name}: no answer within {deadline_s:g} s") from None

    def stop(self) -> None:
        """Ask the thread to end after its current call (a hung thread just stays, as a daemon)."""
        self._queue.put(None)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class CallBlocks(Exception):
    """Raised by a simulated source instead of blocking: this call would not return (a hung NVML call).

    Under the virtual clock nothing may block, so a simulated hang is declared rather than enacted;
    :class:`InlineWorker` answers it exactly as :class:`GpuWorker` answers a call past its deadline.
    """


class InlineWorker:
    """:class:`GpuWorker`'s interface, run inline on the caller's thread: ``sentinel sim``'s virtual clock.

    Thousands of simulated GPUs cannot each have a thread, and a virtual clock cannot wait for a deadline;
    the simulated source returns at once or raises :class:`CallBlocks`. Until such a call "returns" (never,
    for a hung GPU) the worker stays hung and answers :class:`Unresponsive` without calling again, as the
    threaded worker does while its thread is stuck.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.hung = False

    @property
    def busy(self) -> bool:
        return self.hung

    async def call(self, fn: Callable[[], T], deadline_s: float) -> T:
        if self.hung:
            raise Unresponsive(f"{self.name}: an earlier call has not returned")
        try:
            return fn()
        except CallBlocks:
            self.hung = True
            raise Unresponsive(f"{self.name}: no answer within {deadline_s:g} s") from None

    def stop(self) -> None:
        """Nothing to end: no thread."""


Worker = GpuWorker | InlineWorker

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
import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Unresponsive(Exception):
    """The call did not return within its deadline, or an earlier call on this worker still has not."""


#: a call and what to do with its result or error, on the worker's thread once it returns
_Job = tuple[Callable[[], Any], Callable[[Any, "BaseException | None"], None]]


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
            fn, done = job
            self._busy.set()
            try:
                result: Any = fn()
                error: BaseException | None = None
            except BaseException as exc:
                result, error = None, exc
            finally:
                self._busy.clear()
                self.hung = False
            done(result, error)

    def submit(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        """Queue ``fn``; ``done(result, error)`` runs on this worker's thread once it returns."""
        self._queue.put((fn, done))

    def refuses(self) -> bool:
        """An earlier call passed its deadline and has still not returned: nothing more is queued."""
        return self.hung and self.busy

    async def call(self, fn: Callable[[], T], deadline_s: float) -> T:
        """Run ``fn`` in this worker; raise :class:`Unresponsive` when it takes longer than ``deadline_s``."""
        if self.refuses():
            raise Unresponsive(f"{self.name}: an earlier call has not returned")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def done(result: Any, error: BaseException | None) -> None:
            # a closed loop (RuntimeError) means nobody waits for this result any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)

        self.submit(fn, done)
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


class _Round:
    """The answers of one round of calls on several workers; the last call to return wakes the loop (one
    hand-off a round, not one a worker). Answers after :meth:`close` (the deadline) are dropped."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.answers: list[tuple[Any, BaseException | None] | None] = [None] * n
        self.waiting = n
        self.closed = False
        self.lock = threading.Lock()
        self.future: asyncio.Future[None] = loop.create_future()

    def answer(self, slot: int, result: Any, error: BaseException | None) -> None:
        with self.lock:
            if self.closed:
                return
            self.answers[slot] = (result, error)
            self.waiting -= 1
            if self.waiting:
                return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(_settle, self.future, None, None)

    def close(self) -> list[tuple[Any, BaseException | None] | None]:
        with self.lock:
            self.closed = True
            return list(self.answers)


class Calls(Protocol):
    """What :func:`call_each` asks of a worker that is not a :class:`GpuWorker`."""

    async def call(self, fn: Callable[[], T], deadline_s: float) -> T: ...


async def call_each(
    calls: Sequence[tuple[Calls, Callable[[], Any]]], deadline_s: float
) -> list[tuple[Any, BaseException | None]]:
    """Run each call on its worker at once, every one with the same deadline; each call's (result, error),
    in order, an :class:`Unresponsive` error for a call past the deadline (or refused: its worker is still
    stuck). A call that hangs delays none of the others' answers beyond the deadline."""
    answers: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)
    threaded: list[tuple[int, GpuWorker, Callable[[], Any]]] = []
    for slot, (worker, fn) in enumerate(calls):
        if isinstance(worker, GpuWorker):
            if worker.refuses():
                answers[slot] = (None, Unresponsive(f"{worker.name}: an earlier call has not returned"))
            else:
                threaded.append((slot, worker, fn))
            continue
        try:
            answers[slot] = (await worker.call(fn, deadline_s), None)
        except Exception as exc:
            answers[slot] = (None, exc)
    if not threaded:
        return answers
    round_ = _Round(asyncio.get_running_loop(), len(threaded))
    for i, (_, worker, fn) in enumerate(threaded):
        worker.submit(fn, functools.partial(round_.answer, i))
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline_s):
            await round_.future
    for (slot, worker, _), answer in zip(threaded, round_.close(), strict=True):
        if answer is None:
            worker.hung = True
            answers[slot] = (None, Unresponsive(f"{worker.name}: no answer within {deadline_s:g} s"))
        else:
            answers[slot] = answer
    return answers


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

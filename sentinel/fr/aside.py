"""Run one pure step of the analysis on the other core, in a forked child, while this process goes on.

The analysis of a dump set runs after the last dump is decoded, in one process, while the decoding workers'
cores idle, and the straggler lags are a large part of it. :func:`run_aside` forks a child that
computes such a step on what this process already holds — nothing from outside is decoded there, so it
needs none of the decoding workers' limits — and sends its result back as :mod:`marshal` data (plain
numbers, strings and containers only; marshal never runs code). The same function gives the same result
in either process, so where the child cannot be started or does not deliver (an error in the step, a
killed child), the step runs here instead, and its error, if any, is raised here as it always was.

Only for a single-threaded caller (a fork copies only the calling thread: the CLI, never the aggregator's
threaded daemon) on a machine with more than one CPU.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import threading
from collections.abc import Callable

from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


class Aside:
    """A step started aside; :meth:`result` waits for it, :meth:`close` ends the child if still running."""

    __slots__ = ("_compute", "_pid", "_read_fd")

    def __init__(self, compute: Callable[[], Any], pid: int = 0, read_fd: int = -1) -> None:
        self._compute = compute
        self._pid = pid
        self._read_fd = read_fd

    def result(self) -> Any:
        """The step's result: the child's when it delivered one, else computed here."""
        if self._pid == 0:
            return self._compute()
        chunks = []
        try:
            while chunk := os.read(self._read_fd, 1 << 20):
                chunks.append(chunk)
        except OSError:
            chunks = []
        status = self._reap()
        if status != 0 or not chunks:
            return self._compute()
        try:
            return marshal.loads(b"".join(chunks))  # noqa: S302 - written by our own child, never by a dump
        except (EOFError, ValueError, TypeError):
            return self._compute()

    def close(self) -> None:
        """End the child (when :meth:`result` was not asked for: the caller is unwinding)."""
        if self._pid:
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
            self._reap()

    def _reap(self) -> int:
        pid, self._pid = self._pid, 0
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return -1


def run_aside(compute: Callable[[], Any]) -> Aside:
    """Start ``compute`` (pure; its result marshal-able) in a forked child where that can run on another
    core; else it runs when its result is asked for."""
    if threading.active_count() != 1 or (os.cpu_count() or 1) < 2:
        return Aside(compute)
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return Aside(compute)
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return Aside(compute)
    if pid == 0:  # the child: compute, send, and end without any of the parent's teardown
        code = 1
        try:
            os.close(read_fd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            view = memoryview(marshal.dumps(compute()))
            while view:
                view = view[os.write(write_fd, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return Aside(compute, pid, read_fd)

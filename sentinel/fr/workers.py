"""Decoding worker processes with hard bounds: memory, CPU per dump, cancellation, and a named culprit file.

Dumps come from the training hosts (and over the network into the aggregator), so decoding them is
sandboxed in worker processes:

* **memory** — one budget for all workers together (:data:`MEMORY_BUDGET`), split between them: each
  worker's address space (``RLIMIT_AS``) may grow by ``budget // workers`` beyond its start, so the total
  does not grow with the worker count (fewer workers are started when the split would leave each less
  than :data:`MIN_WORKER_MEMORY`). A hostile pickle (a memo index of 2^31 asks the C unpickler for 16 GiB)
  fails with MemoryError inside its worker.
* **CPU** — before each dump the worker's ``RLIMIT_CPU`` soft limit is set :data:`CPU_S_PER_DUMP` beyond
  what it has used: SIGXCPU raises in Python code (the error names the dump), and the hard limit 2 s later
  kills a worker stuck in C code (the parent names the dump it was on from shared memory).
* **cancellation** — the parent waits on the workers' pipes in slices of 0.1 s and checks ``cancel``; on
  cancel, SIGTERM (a signal handler raising), an error or any exception it kills every worker at once
  (SIGKILL), so a daemon's shutdown never waits for a decode.

Each result travels back as msgpack of the batch's :class:`~sentinel.fr.summary.RankSummary` list.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import msgspec

from sentinel.fr.errors import FrFormatError
from sentinel.fr.summary import RankSummary

if TYPE_CHECKING:  # multiprocessing (and ctypes under it) costs a small set's whole decode to import
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

#: Address space all decoding workers together may add to what they had when they started.
MEMORY_BUDGET = 2 << 30
#: Fewer workers are started than would leave each less than this.
MIN_WORKER_MEMORY = 384 << 20
#: CPU seconds one dump may cost a worker (a 2,000-entry dump costs ~5 ms; a 64 MiB one ~2 s).
CPU_S_PER_DUMP = 20.0
#: A worker still on one dump after this many times CPU_S_PER_DUMP of wall time is killed.
WALL_FACTOR = 3.0
#: Seconds between checks of ``cancel`` while waiting for workers.
POLL_S = 0.1

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[RankSummary])

Job = tuple[int, str, int, str]  # (index, path, rank, prefix)
Decode = Callable[[str, int, str], RankSummary]


class Cancelled(Exception):
    """The caller cancelled the decode (daemon shutdown); every worker was killed."""


class _CpuExceeded(Exception):
    pass


def _on_xcpu(_signum: int, _frame: FrameType | None) -> None:
    raise _CpuExceeded


def _cap_memory(extra: int) -> None:
    try:
        with open("/proc/self/statm") as fh:
            now = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = now + extra
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if soft == resource.RLIM_INFINITY or soft > want:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError):
        pass


def _cap_cpu(seconds: float) -> None:
    """Soft RLIMIT_CPU ``seconds`` beyond what this process used (the hard limit is left alone: an
    unprivileged process could never raise it again for the next dump)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _worker(
    conn: Connection, slot: int, shared: tuple[Any, Any], limits: tuple[int, float], decode: Decode
) -> None:
    """Worker loop: receive a batch, decode it dump by dump, send the summaries (or one error line)."""
    current, started = shared
    extra_memory, cpu_s = limits
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; a terminal ^C kills us through it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, _on_xcpu)
    _cap_memory(extra_memory)
    import gc

    gc.disable()  # millions of short-lived acyclic containers: the collector would only rescan them
    while True:
        try:
            batch: list[Job] | None = conn.recv()
        except EOFError:
            return
        if batch is None:
            return
        out: list[RankSummary] = []
        error: str | None = None
        for index, path, rank, prefix in batch:
            current[slot] = index
            started[slot] = time.monotonic()
            _cap_cpu(cpu_s)
            try:
                out.append(decode(path, rank, prefix))
            except FrFormatError as exc:
                error = str(exc)
            except MemoryError:
                error = f"{path}: decoding needs more than {extra_memory >> 20} MiB of memory: refused"
            except _CpuExceeded:
                error = f"{path}: decoding took more than {cpu_s:.0f} s of CPU: refused"
            except RecursionError:
                error = f"{path}: nested too deeply"
            except Exception as exc:  # never a traceback: the parent reports it as a bad dump
                error = f"{path}: cannot analyze: {type(exc).__name__}: {str(exc)[:120]}"
            if error is not None:
                break
        started[slot] = 0.0
        _cap_cpu(3600.0)
        conn.send_bytes(b"E" + error.encode() if error is not None else b"R" + _ENCODER.encode(out))


def split_memory(workers: int, budget: int = MEMORY_BUDGET) -> tuple[int, int]:
    """(workers to start, address-space bytes each may add) within one total ``budget``."""
    workers = max(1, min(workers, budget // MIN_WORKER_MEMORY))
    return workers, budget // workers


def run_pool(
    jobs: Sequence[Job],
    decode: Decode,
    *,
    workers: int,
    batch: int,
    start_method: str,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    budget: int = MEMORY_BUDGET,
    cpu_s: float = CPU_S_PER_DUMP,
) -> list[RankSummary]:
    """Decode ``jobs`` in bounded worker processes; summaries in job order. FrFormatError names the dump
    that failed (and why); :class:`Cancelled` when ``cancel`` is set."""
    from multiprocessing import get_context
    from multiprocessing.connection import wait
    from multiprocessing.sharedctypes import RawArray

    workers, extra = split_memory(workers, budget)
    ctx = get_context(start_method)
    current = RawArray("q", workers)
    started = RawArray("d", workers)  # time.monotonic() when the worker began its current dump, 0 idle
    batches = [list(jobs[i : i + batch]) for i in range(0, len(jobs), batch)]
    results: list[list[RankSummary] | None] = [None] * len(batches)
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    busy: dict[int, int] = {}  # worker slot -> batch index
    todo = list(range(len(batches)))[::-1]
    done_jobs = 0
    try:
        for slot in range(min(workers, len(batches))):
            parent, child = ctx.Pipe()
            proc = ctx.Process(  # type: ignore[attr-defined]
                target=_worker, args=(child, slot, (current, started), (extra, cpu_s), decode), daemon=True
            )
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for slot in range(len(procs)):
            if todo:
                busy[slot] = todo.pop()
                conns[slot].send(batches[busy[slot]])
        while busy:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            ready = wait([conns[s] for s in busy] + [procs[s].sentinel for s in busy], timeout=POLL_S)
            for slot in list(busy):
                conn = conns[slot]
                if conn in ready:
                    try:
                        msg = conn.recv_bytes()
                    except (EOFError, OSError):
                        msg = None
                    if msg is not None:
                        if msg[:1] == b"E":
                            raise FrFormatError(msg[1:].decode(errors="replace"))
                        index = busy.pop(slot)
                        results[index] = _DECODER.decode(msg[1:])
                        done_jobs += len(batches[index])
                        if progress is not None:
                            progress(done_jobs, len(jobs))
                        if todo:
                            busy[slot] = todo.pop()
                            conn.send(batches[busy[slot]])
                        continue
                if procs[slot].sentinel in ready or conn in ready:
                    procs[slot].join(1.0)
                    _raise_died(procs[slot].exitcode, jobs[current[slot]][1], extra, cpu_s)
                began = started[slot]
                wall_limit = WALL_FACTOR * cpu_s + 10.0
                if began and time.monotonic() - began > wall_limit:
                    # stuck in C code where SIGXCPU cannot raise (or starved): stop it, name the dump
                    raise FrFormatError(
                        f"{jobs[current[slot]][1]}: decoding took more than {wall_limit:.0f} s "
                        f"(CPU limit {cpu_s:.0f} s per dump): refused"
                    )
        for conn in conns:
            conn.send(None)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(2.0)
        for conn in conns:
            conn.close()
    out: list[RankSummary] = []
    for part in results:
        out.extend(part or [])
    return out


def _raise_died(code: int | None, path: str, extra: int, cpu_s: float) -> None:
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        raise FrFormatError(f"{path}: decoding took more than {cpu_s:.0f} s of CPU (worker stopped): refused")
    if code == -signal.SIGSEGV:
        raise FrFormatError(f"{path}: the decoder crashed on this dump (worker stopped): refused")
    raise FrFormatError(
        f"{path}: a decoding worker died on this dump (exit {code}; memory cap {extra >> 20} MiB)"
    )


class TerminalProgress:
    """Progress of a long analysis on stderr, only on a terminal and only after ``after_s`` seconds."""

    def __init__(
        self, stream: Any, after_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream = stream
        self.start = clock()
        self.after_s = after_s
        self.clock = clock
        self.shown = False
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if now - self.start < self.after_s or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        self.shown = True
        self.stream.write(
            f"\rsentinel fr analyze: {done}/{total} dumps read and decoded ({now - self.start:.1f} s)"
        )
        self.stream.flush()

    def finish(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()

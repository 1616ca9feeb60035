"""Decoding worker processes with hard bounds: memory, CPU per dump, cancellation, and a named culprit file.

Dumps are hostile input, so they are decoded in workers with one shared address-space budget
(:data:`MEMORY_BUDGET`), a CPU limit per dump (:data:`CPU_S_PER_DUMP`) and cancellation that kills every
worker at once. Results come back as plain data read with the no-globals unpickler. The CLI forks its
workers (no :mod:`multiprocessing` import on its path); threaded daemons use the forkserver.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import pickle
import resource
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from sentinel.fr.errors import FrFormatError
from sentinel.fr.rank_summary import RankSummary, summary_from_plain
from sentinel.fr.records import TYPE_CHECKING
from sentinel.fr.safepickle import loads_plain

if TYPE_CHECKING:  # multiprocessing (and ctypes under it) costs a small set's whole decode to import
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess
    from typing import Any

#: Address space all decoding workers together may add to what they had when they started.
MEMORY_BUDGET = 2 << 30
#: Fewer workers are started than would leave each less than this.
MIN_WORKER_MEMORY = 384 << 20
#: CPU seconds one dump may cost a worker (far above what the largest accepted dump needs).
CPU_S_PER_DUMP = 20.0
#: A worker still on one dump after this many times CPU_S_PER_DUMP of wall time is killed.
WALL_FACTOR = 3.0
#: Seconds between checks of ``cancel`` while waiting for workers.
POLL_S = 0.1

_LEN = 8  # bytes of a message's length prefix on the pipes of a forked worker

Job = tuple[int, str, int, str]  # (index, path, rank, prefix)
Decode = Callable[[str, int, str], RankSummary]
#: Called before each dump with its batch's paths and its index in them (sentinel.fr.readahead.ReadAhead).
ReadAheadHook = Callable[[Sequence[str], int], None]


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


def _cap_cpu(seconds: float, hard: int, current: int = -1) -> int:
    """Soft RLIMIT_CPU ``seconds`` beyond what this process used (the hard limit ``hard``, read once by the
    worker, is left alone: an unprivileged process could never raise it again for the next dump). The
    limit is whole seconds, so most dumps (far shorter) find it already where it must be: ``current``, the
    value this returned last, spares the system call then."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    if soft != current:
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        except (OSError, ValueError):
            return -1
    return soft


def _worker(
    conn: Any,
    slot: int,
    shared: tuple[Any, Any],
    limits: tuple[int, float],
    work: tuple[Decode, ReadAheadHook | None],
) -> None:
    """Worker loop: receive a batch, decode it dump by dump, send the summaries (or one error line).
    ``work``: how to decode a dump, and what to call before each (:func:`run_pool`'s ``read_ahead``)."""
    decode, read_ahead = work
    current, started = shared
    extra_memory, cpu_s = limits
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; a terminal ^C kills us through it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, _on_xcpu)
    _cap_memory(extra_memory)
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)  # never changes: only this loop sets limits
    cpu_soft = -1  # the soft limit last set (-1: unknown)
    import gc

    gc.disable()  # millions of short-lived acyclic containers: the collector would only rescan them
    while True:
        try:
            batch: list[Job] | None = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        out: list[RankSummary] = []
        error: str | None = None
        paths = [job[1] for job in batch]
        for i, (index, path, rank, prefix) in enumerate(batch):
            current[slot] = index
            started[slot] = time.monotonic()
            cpu_soft = _cap_cpu(cpu_s, cpu_hard, cpu_soft)
            try:
                if read_ahead is not None:
                    read_ahead(paths, i)
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
        cpu_soft = _cap_cpu(3600.0, cpu_hard, cpu_soft)
        conn.send_bytes(b"E" + error.encode() if error is not None else b"R" + _plain_bytes(out))


def _plain_bytes(summaries: list[RankSummary]) -> bytes:
    return pickle.dumps([s.to_plain() for s in summaries], protocol=pickle.HIGHEST_PROTOCOL)


def _summaries(data: bytes) -> list[RankSummary]:
    """A worker's result message; FrFormatError when it is not what :func:`_plain_bytes` writes."""
    try:
        return [summary_from_plain(p) for p in loads_plain(data, source="a decoding worker's result")]
    except FrFormatError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise FrFormatError(f"a decoding worker sent a malformed result ({type(exc).__name__})") from None


def split_memory(workers: int, budget: int = MEMORY_BUDGET) -> tuple[int, int]:
    """(workers to start, address-space bytes each may add) within one total ``budget``."""
    workers = max(1, min(workers, budget // MIN_WORKER_MEMORY))
    return workers, budget // workers


class _PipeEnd:
    """A forked worker's side of its two pipes: batches in, results out, each length-prefixed."""

    def __init__(self, jobs_fd: int, results_fd: int) -> None:
        self.jobs_fd, self.results_fd = jobs_fd, results_fd

    def recv(self) -> list[Job] | None:
        head = _read_exact(self.jobs_fd, _LEN)
        if head is None:
            raise EOFError
        body = _read_exact(self.jobs_fd, int.from_bytes(head, "little"))
        if body is None:
            raise EOFError
        batch: list[Job] | None = loads_plain(body, source="a batch of dumps")
        return batch

    def send_bytes(self, data: bytes) -> None:
        _write_all(self.results_fd, len(data).to_bytes(_LEN, "little") + data)


def _read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``; None at end of file (the other side is gone)."""
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _ForkedWorker:
    """A worker started with :func:`os.fork`; its results pipe reaches end of file when it dies."""

    def __init__(self, target: Callable[[Any], None], close_in_child: list[int]) -> None:
        jobs_r, jobs_w = os.pipe()
        results_r, results_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child (measured through the parent's results)
            code = 0
            try:
                for fd in (jobs_w, results_r, *close_in_child):
                    os.close(fd)
                target(_PipeEnd(jobs_r, results_w))
            except BaseException:
                code = 70
            finally:
                os._exit(code)  # never the parent's atexit handlers or buffered output
        os.close(jobs_r)
        os.close(results_w)
        self.pid = pid
        self.jobs_fd, self.results_fd = jobs_w, results_r
        self.exitcode: int | None = None
        self.fds = [results_r]
        self.retired = False
        self.detached = False

    def send(self, batch: list[Job] | None) -> None:
        body = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(self.jobs_fd, len(body).to_bytes(_LEN, "little") + body)

    def message(self, ready: set[int]) -> bytes | None:
        """The worker's next message once its pipe is readable; None when it died."""
        if self.results_fd not in ready:
            raise BlockingIOError
        head = _read_exact(self.results_fd, _LEN)
        body = None if head is None else _read_exact(self.results_fd, int.from_bytes(head, "little"))
        return body

    def detach(self) -> None:
        """Done and told to exit: reaped by a later :func:`run_pool` call (or when this process exits),
        not waited for now, where its teardown cost a small set a few ms."""
        self.detached = True
        _UNREAPED.append(self.pid)

    def kill(self) -> None:
        if self.exitcode is None and not self.detached:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.exitcode is None and not self.detached:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.exitcode = -1
                break
            if pid:
                self.exitcode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)

    def close(self) -> None:
        for fd in (self.jobs_fd, self.results_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class _MpWorker:
    """A worker started through :mod:`multiprocessing` (forkserver: safe in threaded daemons)."""

    def __init__(self, ctx: Any, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        parent, child = ctx.Pipe()
        self.proc: BaseProcess = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()
        self.conn: Connection = parent
        self.fds = [parent.fileno(), self.proc.sentinel]
        self.retired = False

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode

    def send(self, batch: list[Job] | None) -> None:
        self.conn.send(batch)

    def message(self, ready: set[int]) -> bytes | None:
        if self.conn.fileno() in ready:
            try:
                return self.conn.recv_bytes()
            except (EOFError, OSError):
                return None
        if self.proc.sentinel in ready:
            return None
        raise BlockingIOError

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()

    def join(self, timeout: float) -> None:
        self.proc.join(timeout)

    def close(self) -> None:
        self.conn.close()


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
    read_ahead: ReadAheadHook | None = None,
) -> list[RankSummary]:
    """Decode ``jobs`` in bounded worker processes; summaries in job order. FrFormatError names the dump
    that failed (and why); :class:`Cancelled` when ``cancel`` is set. ``start_method``: "fork" (only
    from a single-threaded process) or a :mod:`multiprocessing` start method. ``read_ahead``: called in
    the worker before each dump (each worker has its own copy of it)."""
    _reap_exited()
    workers, extra = split_memory(workers, budget)
    batches = _batches(jobs, batch, workers)
    results: list[list[RankSummary] | None] = [None] * len(batches)
    n = min(workers, len(batches))
    pool: list[_ForkedWorker | _MpWorker] = []
    if start_method == "fork":
        # shared with the children: the dump each one is on, and since when (0.0: idle)
        shm = mmap.mmap(-1, 16 * max(1, n))
        current: Any = memoryview(shm)[: 8 * max(1, n)].cast("q")
        started: Any = memoryview(shm)[8 * max(1, n) :].cast("d")
    else:
        from multiprocessing import get_context
        from multiprocessing.sharedctypes import RawArray

        ctx = get_context(start_method)
        current = RawArray("q", max(1, n))
        started = RawArray("d", max(1, n))  # time.monotonic() when the worker began its dump, 0 idle
    busy: dict[int, int] = {}  # worker slot -> batch index
    todo = list(range(len(batches)))[::-1]
    done_jobs = 0
    try:
        for slot in range(n):
            args = (slot, (current, started), (extra, cpu_s), (decode, read_ahead))
            if start_method == "fork":
                inherited = [
                    fd for w in pool if isinstance(w, _ForkedWorker) for fd in (w.jobs_fd, w.results_fd)
                ]
                pool.append(_ForkedWorker(functools.partial(_worker_of, args), inherited))
            else:
                pool.append(_MpWorker(ctx, _worker, args))
        for slot, worker in enumerate(pool):
            if todo:
                busy[slot] = todo.pop()
                worker.send(batches[busy[slot]])
        while busy:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            watched = [fd for s in busy for fd in pool[s].fds]
            ready = set(select.select(watched, [], [], POLL_S)[0])
            for slot in list(busy):
                worker = pool[slot]
                try:
                    msg = worker.message(ready)
                except BlockingIOError:
                    msg = b""
                else:
                    if msg is None:  # died: its pipe closed
                        worker.join(1.0)
                        _raise_died(worker.exitcode, jobs[current[slot]][1], extra, cpu_s)
                if msg:
                    if msg[:1] == b"E":
                        raise FrFormatError(msg[1:].decode(errors="replace"))
                    index = busy.pop(slot)
                    results[index] = _summaries(msg[1:])
                    done_jobs += len(batches[index])
                    if progress is not None:
                        progress(done_jobs, len(jobs))
                    if todo:
                        busy[slot] = todo.pop()
                        worker.send(batches[busy[slot]])
                    else:
                        _retire(worker)  # exits while the others finish, not after
                    continue
                began = started[slot]
                wall_limit = WALL_FACTOR * cpu_s + 10.0
                if began and time.monotonic() - began > wall_limit:
                    # stuck in C code where SIGXCPU cannot raise (or starved): stop it, name the dump
                    raise FrFormatError(
                        f"{jobs[current[slot]][1]}: decoding took more than {wall_limit:.0f} s "
                        f"(CPU limit {cpu_s:.0f} s per dump): refused"
                    )
        for worker in pool:
            _retire(worker)
        for worker in pool:
            if isinstance(worker, _ForkedWorker):
                worker.detach()
            else:
                worker.join(1.0)
    finally:
        for worker in pool:
            worker.kill()  # on an error, a cancel or SIGTERM: at once; else only one that did not exit
        for worker in pool:
            worker.join(2.0)
        for worker in pool:
            worker.close()
    out: list[RankSummary] = []
    for part in results:
        out.extend(part or [])
    return out


#: Forked workers that were told to exit and not waited for (see :func:`run_pool`).
_UNREAPED: list[int] = []


def _retire(worker: _ForkedWorker | _MpWorker) -> None:
    """Tell an idle worker there is no more work (it exits by itself); once."""
    if not worker.retired:
        worker.retired = True
        with contextlib.suppress(OSError):
            worker.send(None)


def _reap_exited() -> None:
    """Collect the exit status of the forked workers earlier calls left (no zombies pile up)."""
    for pid in list(_UNREAPED):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _UNREAPED.remove(pid)


def reap_workers(timeout: float = 2.0) -> None:
    """Wait (at most ``timeout`` seconds) for the workers that were told to exit: a program calls it
    before it exits, so that its workers have ended, and their CPU time is counted as its own (a parent
    that exits first leaves them to init). They were told to exit when the decode ended, so by the end
    of the analysis they have."""
    deadline = time.monotonic() + timeout
    while _UNREAPED and time.monotonic() < deadline:
        _reap_exited()
        if _UNREAPED:
            time.sleep(0.001)


def _batches(jobs: Sequence[Job], batch: int, workers: int) -> list[list[Job]]:
    """``jobs`` cut into batches of ``batch``, then smaller ones towards the end (each at most a share of
    what is left): the workers then finish together, where the last full batch could leave one of them
    decoding alone for its whole length while the others idle (a tenth of a small set's time)."""
    out = []
    i = 0
    smallest = max(1, batch // 8)  # a message each way per batch: not single dumps
    while i < len(jobs):
        size = max(smallest, min(batch, (len(jobs) - i) // (2 * workers)))
        out.append(list(jobs[i : i + size]))
        i += size
    return out


def _worker_of(args: tuple[Any, ...], conn: Any) -> None:
    _worker(conn, *args)


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

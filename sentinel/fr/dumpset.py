"""Read a whole directory of dumps — in parallel worker processes for large sets — and analyze it.

Each worker decodes a batch of dumps and sends back only their :class:`RankSummary` (msgpack), so peak
memory stays at a few dumps per worker however many ranks the job had.
"""

from __future__ import annotations

import gc
import os
import resource
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

import msgspec

from sentinel.fr.analysis import FrAnalysis, analyze
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import DumpFile, discover, load_dump
from sentinel.fr.summary import RankSummary, summarize

#: Address space a decoding worker may add to what it had when it started.
DECODE_MEMORY_LIMIT = 3 << 30
_BATCH = 16
#: Newest entries analyzed per large pickle dump by default (``None``: every entry).
RECENT_ENTRIES = 256

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[RankSummary])


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding allocates millions of short-lived containers and no cycles worth collecting; the cyclic
    collector would rescan the growing heap again and again (20-25% of the time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summarize_file(dump: DumpFile, recent: int | None = RECENT_ENTRIES) -> RankSummary:
    """Load and reduce one dump file (only its newest ``recent`` entries when that is enough)."""
    return summarize(load_dump(dump.path, dump.rank, recent=recent))


def _summarize_batch(batch: Sequence[tuple[str, int, str]], recent: int | None) -> bytes | str:
    """Worker: reduce a batch; a format error comes back as its one-line message."""
    out = []
    for path, rank, prefix in batch:
        try:
            with _gc_paused():
                out.append(summarize_file(DumpFile(Path(path), rank, prefix), recent))
        except FrFormatError as exc:
            return str(exc)
        except MemoryError:
            return f"{path}: decoding needs more than {DECODE_MEMORY_LIMIT >> 20} MiB: refused"
    return _ENCODER.encode(out)


def _limit_memory() -> None:
    """Worker initializer: cap this process's address space, so a hostile dump (a memo index of 2^31 makes
    the C unpickler allocate 16 GiB) fails with MemoryError instead of exhausting the host."""
    try:
        with open("/proc/self/statm") as fh:
            now = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = now + DECODE_MEMORY_LIMIT
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if soft == resource.RLIM_INFINITY or soft > want:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError):
        pass


@contextmanager
def limited_address_space(extra: int = DECODE_MEMORY_LIMIT) -> Iterator[None]:
    """Cap this process's address space for the duration (soft limit, restored after). For tests and
    single-threaded tools decoding in-process; daemons decode in workers (:func:`summarize_dir`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    _limit_memory()
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def summarize_dir(
    root: Path,
    workers: int | None = None,
    start_method: str | None = None,
    recent: int | None = RECENT_ENTRIES,
) -> list[RankSummary]:
    """Every rank's summary under ``root``; FrFormatError for unusable input.

    Dumps are decoded in ``workers`` processes (default: one per CPU, at most 32) whose address space is
    capped (:data:`DECODE_MEMORY_LIMIT` beyond their start), so no dump can exhaust the host or crash the
    caller. ``workers=0`` decodes in this process, for trusted input. ``start_method``: "fork" when this
    process runs a single thread, else "forkserver" (safe in threaded daemons).
    """
    files = discover(root)
    if workers == 0:
        with _gc_paused():
            return [summarize_file(f, recent) for f in files]
    if workers is None:
        workers = min(os.cpu_count() or 1, 32)
    workers = max(1, min(workers, len(files)))
    size = max(1, min(_BATCH, -(-len(files) // workers)))
    batches = [
        [(str(f.path), f.rank, f.prefix) for f in files[i : i + size]] for i in range(0, len(files), size)
    ]
    if start_method is None:
        start_method = "fork" if threading.active_count() == 1 else "forkserver"
    out: list[RankSummary] = []
    try:
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=get_context(start_method), initializer=_limit_memory
        ) as pool:
            for result in pool.map(_summarize_batch, batches, [recent] * len(batches)):
                if isinstance(result, str):
                    raise FrFormatError(result)
                with _gc_paused():
                    out.extend(_DECODER.decode(result))
    except BrokenProcessPool as exc:
        raise FrFormatError(f"{root}: a decoding worker died ({exc or 'killed'})") from None
    return out


def analyze_dir(
    root: Path,
    workers: int | None = None,
    start_method: str | None = None,
    recent: int | None = RECENT_ENTRIES,
) -> FrAnalysis:
    """Read every dump under ``root`` and analyze them (see :func:`sentinel.fr.analysis.analyze`).

    ``recent``: analyze only the newest entries of large pickle dumps (when they hold every collective
    still waited in); ``None`` decodes every entry.
    """
    return analyze(summarize_dir(root, workers, start_method, recent))

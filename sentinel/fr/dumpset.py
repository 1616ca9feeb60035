"""Read a whole directory of dumps — in parallel worker processes for large sets — and analyze it.

Each worker (:mod:`sentinel.fr.workers`) decodes a batch of dumps and sends back only their
:class:`RankSummary` (plain data), so peak memory stays at a few dumps per worker however many ranks the job
had.
"""

from __future__ import annotations

import functools
import gc
import os
import resource
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sentinel.fr.analysis import analyze
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import DumpFile, PathLike, discover, load_dump
from sentinel.fr.rank_summary import RankSummary
from sentinel.fr.readahead import ReadAhead
from sentinel.fr.summary import summarize
from sentinel.fr.verdict import FrAnalysis
from sentinel.fr.workers import Cancelled, _cap_memory, run_pool

#: Dumps per batch sent to a worker.
_BATCH = 32
#: Newest entries analyzed per large pickle dump by default (``None``: every entry).
RECENT_ENTRIES = 128
#: From this many dumps, entries are checked by msgspec (:func:`sentinel.fr.summary.summarize` with
#: ``coerce``), whose checks in C cost less per entry than those in Python by more, over the set, than
#: importing msgspec costs (a large share of a small analysis). Both ways give the same summaries.
COERCE_FROM = 128


@contextmanager
def _gc_paused(only_if_alone: bool = False) -> Iterator[None]:
    """Decoding allocates millions of short-lived containers and no cycles worth collecting; the cyclic
    collector would rescan the growing heap again and again (a fifth or more of the time, also in the
    CLI's parent, which gathers every summary and analyzes them). ``only_if_alone``: pause
    only when this process runs a single thread (the collector is process-wide: a daemon's other
    threads keep theirs)."""
    if only_if_alone and threading.active_count() != 1:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summarize_file(
    dump: DumpFile,
    recent: int | None = RECENT_ENTRIES,
    *,
    coerce: bool = False,
    read_ahead: ReadAhead | None = None,
) -> RankSummary:
    """Load and reduce one dump file (only its newest ``recent`` entries when that is enough)."""
    raw = load_dump(dump.path, dump.rank, recent=recent, read_ahead=read_ahead)
    try:
        return summarize(raw, coerce=coerce)
    except FrFormatError:
        if not raw.fields_only:
            raise
    # refused: named from the entries as the file holds them (see RawDump.fields_only)
    raw = load_dump(dump.path, dump.rank, recent=recent, fields_only=False)
    return summarize(raw, coerce=coerce)


def _decode_one(
    path: str, rank: int, prefix: str, *, recent: int | None, coerce: bool, read_ahead: ReadAhead
) -> RankSummary:
    return summarize_file(DumpFile(path, rank, prefix), recent, coerce=coerce, read_ahead=read_ahead)


def _coerce_for(files: int) -> bool:
    """Whether to check entries with msgspec (see :data:`COERCE_FROM`); it is imported here, before any
    worker starts, so that forked workers share one import."""
    if files < COERCE_FROM and "msgspec" not in sys.modules:  # a daemon has it imported already
        return False
    import sentinel.fr.coerce  # noqa: F401

    return True


@contextmanager
def limited_address_space(extra: int = 3 << 30) -> Iterator[None]:
    """Cap this process's address space for the duration (soft limit, restored after). For tests and
    single-threaded tools decoding in-process; daemons decode in workers (:func:`summarize_dir`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    _cap_memory(extra)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def summarize_dir(
    root: PathLike,
    workers: int | None = None,
    start_method: str | None = None,
    recent: int | None = RECENT_ENTRIES,
    *,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[RankSummary]:
    """Every rank's summary under ``root``; FrFormatError for unusable input (the message names the file).

    Dumps are decoded in ``workers`` processes (default: one per CPU, at most 32) bounded in memory (one
    budget for all of them), CPU per dump and time (``cancel`` kills them at once); see
    :mod:`sentinel.fr.workers`. ``workers=0`` decodes in this process, for trusted input. ``start_method``:
    "fork" when this process runs a single thread, else "forkserver" (safe in threaded daemons).
    ``progress(done, total)`` is called as dumps are decoded. Dumps read from their newest entries that
    skipped completed send/recv entries are read again in full when any rank waits (see below).
    """
    files = discover(root)
    out = _summarize(files, workers, start_method, recent, cancel=cancel, progress=progress)
    # Completed send/recv entries skipped by a newest-entries decode are what the analysis matches a
    # rank's pending send/recv against (its peer's ops since a shared collective) and where it finds a
    # culprit's program order: unused while no rank waits, needed once one does.
    redo = [i for i, s in enumerate(out) if s.skipped_p2p]
    if redo and any(s.waits() for s in out):
        again = _summarize(
            [files[i] for i in redo], workers, start_method, None, cancel=cancel, progress=None
        )
        for i, s in zip(redo, again, strict=True):
            out[i] = s
    return out


def _summarize(
    files: list[DumpFile],
    workers: int | None,
    start_method: str | None,
    recent: int | None,
    *,
    cancel: threading.Event | None,
    progress: Callable[[int, int], None] | None,
) -> list[RankSummary]:
    coerce = _coerce_for(len(files))
    read_ahead = ReadAhead()  # each worker gets its own copy
    if workers == 0:
        out = []
        paths = [f.path for f in files]
        with _gc_paused():
            for i, f in enumerate(files):
                if cancel is not None and cancel.is_set():
                    raise Cancelled
                read_ahead(paths, i)
                out.append(summarize_file(f, recent, coerce=coerce, read_ahead=read_ahead))
                if progress is not None and (i % _BATCH == 0 or i + 1 == len(files)):
                    progress(i + 1, len(files))
        return out
    if workers is None:
        workers = min(os.cpu_count() or 1, 32)
    workers = max(1, min(workers, -(-len(files) // 8)))  # a worker is worth starting for 8 dumps or more
    size = max(1, min(_BATCH, -(-len(files) // (4 * workers))))
    if start_method is None:
        start_method = "fork" if threading.active_count() == 1 else "forkserver"
    jobs = [(i, str(f.path), f.rank, f.prefix) for i, f in enumerate(files)]
    with _gc_paused(only_if_alone=True):
        return run_pool(
            jobs,
            functools.partial(_decode_one, recent=recent, coerce=coerce, read_ahead=read_ahead),
            workers=workers,
            batch=size,
            start_method=start_method,
            cancel=cancel,
            progress=progress,
            read_ahead=read_ahead,
        )


def analyze_dir(
    root: PathLike,
    workers: int | None = None,
    start_method: str | None = None,
    recent: int | None = RECENT_ENTRIES,
    *,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    aside: bool = False,
) -> FrAnalysis:
    """Read every dump under ``root`` and analyze them (see :func:`sentinel.fr.analysis.analyze`).

    ``recent``: analyze only the newest entries of large pickle dumps (when they hold every collective
    still waited in); ``None`` decodes every entry. ``aside``: part of the analysis runs in a forked
    child on another core (single-threaded callers: see :mod:`sentinel.fr.aside`).
    """
    with _gc_paused(only_if_alone=True):
        summaries = summarize_dir(root, workers, start_method, recent, cancel=cancel, progress=progress)
        return analyze(summaries, aside=aside)

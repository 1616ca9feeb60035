"""Read a whole directory of dumps — in parallel worker processes for large sets — and analyze it.

Each worker decodes a batch of dumps and sends back only their :class:`RankSummary` (msgpack), so peak
memory stays at a few dumps per worker however many ranks the job had.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

import msgspec

from sentinel.fr.analysis import FrAnalysis, analyze
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import DumpFile, discover, load_dump
from sentinel.fr.summary import RankSummary, summarize

#: Below this many files or bytes, decoding in-process beats starting workers.
PARALLEL_MIN_FILES = 48
PARALLEL_MIN_BYTES = 48 * 1024 * 1024
_BATCH = 16
#: Newest entries analyzed per large pickle dump by default (``None``: every entry).
RECENT_ENTRIES = 512

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
    try:
        with _gc_paused():
            return _ENCODER.encode([summarize_file(DumpFile(Path(p), r, pre), recent) for p, r, pre in batch])
    except FrFormatError as exc:
        return str(exc)


def summarize_dir(
    root: Path,
    workers: int | None = None,
    start_method: str = "forkserver",
    recent: int | None = RECENT_ENTRIES,
) -> list[RankSummary]:
    """Every rank's summary under ``root``; FrFormatError for unusable input.

    ``start_method`` is the multiprocessing start method of the workers: "forkserver" is safe in threaded
    daemons; a single-threaded command may pass "fork", which starts faster.
    """
    files = discover(root)
    if workers is None:
        workers = min(os.cpu_count() or 1, 32)
    if workers <= 1 or len(files) < PARALLEL_MIN_FILES or _total_bytes(files) < PARALLEL_MIN_BYTES:
        with _gc_paused():
            return [summarize_file(f, recent) for f in files]
    batches = [
        [(str(f.path), f.rank, f.prefix) for f in files[i : i + _BATCH]] for i in range(0, len(files), _BATCH)
    ]
    out: list[RankSummary] = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context(start_method)) as pool:
        for result in pool.map(_summarize_batch, batches, [recent] * len(batches)):
            if isinstance(result, str):
                raise FrFormatError(result)
            with _gc_paused():
                out.extend(_DECODER.decode(result))
    return out


def analyze_dir(
    root: Path,
    workers: int | None = None,
    start_method: str = "forkserver",
    recent: int | None = RECENT_ENTRIES,
) -> FrAnalysis:
    """Read every dump under ``root`` and analyze them (see :func:`sentinel.fr.analysis.analyze`).

    ``recent``: analyze only the newest entries of large pickle dumps (when they hold every collective
    still waited in); ``None`` decodes every entry.
    """
    return analyze(summarize_dir(root, workers, start_method, recent))


def _total_bytes(files: Sequence[DumpFile]) -> int:
    total = 0
    for f in files:
        try:
            total += f.path.stat().st_size
        except OSError:
            continue
        if total >= PARALLEL_MIN_BYTES:
            break
    return total

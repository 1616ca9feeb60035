"""PyTorch Flight Recorder dumps on this host: notice new dump files, and ask ranks to dump.

PyTorch writes a rank's full FR trace to ``TORCH_FR_DUMP_TEMP_FILE`` + rank (on a watchdog timeout, or when
asked); the agent watches that folder and reports each new file as an ``fr_dump`` event so the aggregator
knows where the evidence is. A dump is requested by writing to the pipe each rank opens at
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` + rank + ``.pipe`` (ProcessGroupNCCL's DumpPipe polls it), through
:mod:`sentinel.fr.trigger`.

For a job-wide analysis the aggregator asks for the dumps themselves (:func:`collect_dumps`): after the
pipes are written the agent waits, bounded, until every triggered rank's dump has appeared and stopped
growing, and returns the files gzip-compressed within a byte budget that fits one WebSocket frame. The agent
never decodes a dump; the aggregator does, with the safe loader.
"""

from __future__ import annotations

import gzip
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from sentinel.components.bounds import MAX_SHORT_CHARS
from sentinel.fr.trigger import pipe_path, trigger_dumps
from sentinel.log import get_logger
from sentinel.wire import (
    MAX_FR_ANSWER_BYTES,
    MAX_RANK,
    MAX_TEXT_CHARS,
    DumpFile,
    FrDumpAnswer,
    FrDumpWritten,
)

log = get_logger(module="agent.frdump")

_RANK = re.compile(r"(\d+)(?:\.json)?(?:\.gz)?$")
_DUMP_SUFFIX = re.compile(r"(\d{1,8})(\.json)?(\.gz)?")
_GZIP_MAGIC = b"\x1f\x8b"
#: Largest dump file read (raw): far above a full 2,000-entry dump with stack frames.
MAX_DUMP_FILE_BYTES = 64 * 1024 * 1024
#: Compressed dump bytes returned in one answer at most: with the msgpack envelope it fits one frame.
MAX_COLLECT_BYTES = MAX_FR_ANSWER_BYTES
#: Longest wait for triggered ranks to write their dumps.
MAX_COLLECT_WAIT_S = 60.0
_POLL_S = 0.1


def local_pipe_ranks(prefix: str) -> list[int]:
    """Ranks with a dump pipe under ``prefix`` (``<prefix><rank>.pipe``), for when no mapping names them."""
    directory, stem = Path(prefix).parent, Path(prefix).name
    ranks: list[int] = []
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError:
        return []
    for name in names:
        if name.startswith(stem):
            rest = name[len(stem) :].removesuffix(".pipe")
            if rest.isdigit():
                ranks.append(int(rest))
    return sorted(set(ranks))


def trigger_fr_dump(prefix: str, ranks: Iterable[int] | None) -> FrDumpAnswer:
    """Ask these local ranks (all with a pipe when None) to dump, through :mod:`sentinel.fr.trigger`.

    Returns the pipes written, the ranks triggered, those without a pipe and those whose pipe failed.
    """
    if not prefix:
        return FrDumpAnswer(error="probe.fr_pipe_prefix not set")
    wanted = local_pipe_ranks(prefix) if ranks is None else sorted(set(ranks))
    result = trigger_dumps(prefix, wanted)
    pipes = [path for path in (pipe_path(prefix, rank) for rank in result.triggered) if path is not None]
    return FrDumpAnswer(
        pipes=pipes,
        triggered=list(result.triggered),
        missing=list(result.missing),
        failed={str(rank): reason[:MAX_SHORT_CHARS] for rank, reason in result.failed.items()},
    )


class FrDumpWatcher:
    """Reports dump files that appear in the FR dump folder (by name prefix)."""

    def __init__(self, directory: str, prefix: str) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self._seen: dict[str, float] = {}
        self._primed = False

    def poll(self, now: float) -> list[FrDumpWritten]:
        try:
            entries = [
                e for e in os.scandir(self.directory) if e.name.startswith(self.prefix) and e.is_file()
            ]
        except OSError:
            return []
        events: list[FrDumpWritten] = []
        for entry in entries:
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            if self._seen.get(entry.name) == mtime:
                continue
            self._seen[entry.name] = mtime
            if not self._primed:
                continue
            match = _RANK.search(entry.name[len(self.prefix) :])
            events.append(
                FrDumpWritten(
                    t=now,
                    source="fr",
                    severity="warning",
                    text=f"flight-recorder dump written: {entry.path}"[:MAX_TEXT_CHARS],
                    path=entry.path[:MAX_SHORT_CHARS],
                    rank=int(match.group(1)) if match else None,
                )
            )
        self._primed = True
        if len(self._seen) > 100000:
            self._seen.clear()
        return events


def fresh_dumps(
    directory: str, prefix: str, since: float, ranks: set[int] | None = None
) -> dict[int, tuple[str, int, float]]:
    """rank → (path, size, mtime) of the newest dump per rank written at or after ``since`` (unix time).

    Only names PyTorch writes count: ``<prefix><rank>``, optionally ``.json`` and/or ``.gz`` (a temporary
    file being written under another name is not a dump yet). ``ranks`` restricts to those ranks.
    """
    found: dict[int, tuple[str, int, float]] = {}
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(prefix)]
    except OSError:
        return found
    for entry in entries:
        match = _DUMP_SUFFIX.fullmatch(entry.name[len(prefix) :])
        if match is None:
            continue
        rank = int(match.group(1))
        if ranks is not None and rank not in ranks:
            continue
        try:
            st = entry.stat()
        except OSError:
            continue
        if not entry.is_file() or st.st_mtime < since:
            continue
        known = found.get(rank)
        if known is None or st.st_mtime > known[2]:
            found[rank] = (entry.path, st.st_size, st.st_mtime)
    return found


def collect_dumps(
    directory: str,
    prefix: str,
    *,
    since: float,
    expect: Iterable[int] = (),
    ranks: Iterable[int] | None = None,
    wait_s: float = 10.0,
    max_bytes: int = MAX_COLLECT_BYTES,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> FrDumpAnswer:
    """The fresh dump files of this host, gzip-compressed, for the aggregator's job-wide analysis.

    Waits up to ``wait_s`` until every rank in ``expect`` (the ranks whose pipes were written) has a dump
    written since ``since`` whose size and mtime held still over one poll (PyTorch may write in place).
    Returns the answer's ``dumps`` (``data``: gzip bytes, at most ``max_bytes`` over all dumps; the rest
    is listed in ``skipped`` with the reason) and ``waited_s``.
    """
    wanted = set(ranks) if ranks is not None else None
    expected = set(expect)
    if wanted is not None:
        wanted |= expected
    wait_s = min(max(wait_s, 0.0), MAX_COLLECT_WAIT_S)
    max_bytes = min(max(max_bytes, 0), MAX_COLLECT_BYTES)
    start = clock()
    previous: dict[int, tuple[str, int, float]] = {}
    while True:
        found = fresh_dumps(directory, prefix, since, wanted)
        stable = {r for r, info in found.items() if info[1] > 0 and previous.get(r) == info}
        if (expected <= stable and found.keys() <= stable) or clock() - start >= wait_s:
            break
        previous = found
        sleep(_POLL_S)
    dumps: list[DumpFile] = []
    skipped: dict[str, str] = {}
    budget = max_bytes
    for rank in sorted(found):
        path, size, _ = found[rank]
        if not 0 <= rank < MAX_RANK:
            skipped[str(rank)] = "not a rank number the aggregator accepts"
            continue
        if rank not in stable:
            skipped[str(rank)] = "still being written when the wait ended"
            continue
        if size > MAX_DUMP_FILE_BYTES:
            skipped[str(rank)] = f"{size} bytes, more than {MAX_DUMP_FILE_BYTES}"
            continue
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_DUMP_FILE_BYTES + 1)
        except OSError as exc:
            skipped[str(rank)] = f"cannot read: {exc.strerror or exc}"
            continue
        data = raw if raw[:2] == _GZIP_MAGIC else gzip.compress(raw, compresslevel=6, mtime=0)
        if len(data) > budget:
            skipped[str(rank)] = (
                f"{len(data)} compressed bytes do not fit the remaining {budget} of the answer"
            )
            continue
        budget -= len(data)
        dumps.append(DumpFile(rank=rank, name=os.path.basename(path)[:255], size=len(raw), data=data))
    for rank in sorted(expected - found.keys()):
        skipped[str(rank)] = "no dump appeared"
    return FrDumpAnswer(dumps=dumps, skipped=skipped, waited_s=round(clock() - start, 3))

"""PyTorch Flight Recorder dumps on this host: notice new dump files, and ask ranks to dump.

PyTorch writes a rank's full FR trace to ``TORCH_FR_DUMP_TEMP_FILE`` + rank (on a watchdog timeout, or when
asked); the agent watches that folder and reports each new file as an ``fr_dump`` event so the aggregator
knows where the evidence is. A dump is requested by writing to the pipe each rank opens at
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` + rank + ``.pipe`` (ProcessGroupNCCL's DumpPipe polls it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from sentinel.agent._log import module_logger
from sentinel.wire import Event

log = module_logger("agent.frdump")

_RANK = re.compile(r"(\d+)(?:\.json)?(?:\.gz)?$")


def write_trigger_pipes(prefix: str, ranks: Iterable[int] | None) -> list[str]:
    """Write one byte to ``<prefix><rank>.pipe`` for each rank (all existing pipes when ranks is None).

    Returns the pipes written. Non-blocking: a pipe nobody reads (ENXIO) or a full one is skipped.
    """
    if not prefix:
        return []
    if ranks is None:
        directory = Path(prefix).parent
        stem = Path(prefix).name
        try:
            paths = sorted(
                str(p) for p in directory.iterdir() if p.name.startswith(stem) and p.name.endswith(".pipe")
            )
        except OSError:
            return []
    else:
        paths = [f"{prefix}{rank}.pipe" for rank in sorted(set(ranks))]
    written: list[str] = []
    for path in paths:
        try:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                continue
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENXIO):
                log.warning("fr_pipe_open_failed", path=path, error=exc.strerror or str(exc))
            continue
        try:
            os.write(fd, b"1\n")
            written.append(path)
        except OSError as exc:
            log.warning("fr_pipe_write_failed", path=path, error=exc.strerror or str(exc))
        finally:
            os.close(fd)
    return written


def trigger_fr_dump(prefix: str, ranks: Iterable[int] | None) -> list[str]:
    """Use the flight-recorder package's trigger when it provides one, else :func:`write_trigger_pipes`."""
    try:
        from sentinel.fr import trigger as fr_trigger  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return write_trigger_pipes(prefix, ranks)
    fn = getattr(fr_trigger, "trigger_dump", None) or getattr(fr_trigger, "write_trigger_pipes", None)
    if fn is None:
        return write_trigger_pipes(prefix, ranks)
    with contextlib.suppress(TypeError):
        result = fn(prefix, None if ranks is None else list(ranks))
        if isinstance(result, list):
            return [str(p) for p in result]
        return []
    return write_trigger_pipes(prefix, ranks)


class FrDumpWatcher:
    """Reports dump files that appear in the FR dump folder (by name prefix)."""

    def __init__(self, directory: str, prefix: str) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self._seen: dict[str, float] = {}
        self._primed = False

    def poll(self, now: float) -> list[Event]:
        try:
            entries = [
                e for e in os.scandir(self.directory) if e.name.startswith(self.prefix) and e.is_file()
            ]
        except OSError:
            return []
        events: list[Event] = []
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
                Event(
                    t=now,
                    kind="fr_dump",
                    source="fr",
                    severity="warning",
                    text=f"flight-recorder dump written: {entry.path}"[:4096],
                    fields={"path": entry.path[:1024], "rank": int(match.group(1)) if match else None},
                )
            )
        self._primed = True
        if len(self._seen) > 100000:
            self._seen.clear()
        return events

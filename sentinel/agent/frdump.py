"""PyTorch Flight Recorder dumps on this host: notice new dump files, and ask ranks to dump.

PyTorch writes a rank's full FR trace to ``TORCH_FR_DUMP_TEMP_FILE`` + rank (on a watchdog timeout, or when
asked); the agent watches that folder and reports each new file as an ``fr_dump`` event so the aggregator
knows where the evidence is. A dump is requested by writing to the pipe each rank opens at
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` + rank + ``.pipe`` (ProcessGroupNCCL's DumpPipe polls it), through
:mod:`sentinel.fr.trigger`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sentinel.fr.trigger import pipe_path, trigger_dumps
from sentinel.log import get_logger
from sentinel.wire import Event

log = get_logger(module="agent.frdump")

_RANK = re.compile(r"(\d+)(?:\.json)?(?:\.gz)?$")


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


def trigger_fr_dump(prefix: str, ranks: Iterable[int] | None) -> dict[str, Any]:
    """Ask these local ranks (all with a pipe when None) to dump, through :mod:`sentinel.fr.trigger`.

    Returns the command payload: ``{"pipes": [paths written], "triggered": [ranks], "missing": [ranks],
    "failed": {rank: reason}}``.
    """
    if not prefix:
        return {
            "pipes": [],
            "triggered": [],
            "missing": [],
            "failed": {},
            "error": "probe.fr_pipe_prefix not set",
        }
    wanted = local_pipe_ranks(prefix) if ranks is None else sorted(set(ranks))
    result = trigger_dumps(prefix, wanted)
    pipes = [path for path in (pipe_path(prefix, rank) for rank in result.triggered) if path is not None]
    return {
        "pipes": pipes,
        "triggered": list(result.triggered),
        "missing": list(result.missing),
        "failed": {str(rank): reason for rank, reason in result.failed.items()},
    }


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

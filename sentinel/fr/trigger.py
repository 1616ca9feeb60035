"""Ask running PyTorch processes for a Flight Recorder dump through their debug-info pipes.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<prefix>`` every rank's ProcessGroupNCCL creates a FIFO
``<prefix><rank>.pipe`` and dumps its flight recorder (to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``)
when anything is written into it. The agent calls :func:`trigger_dumps` when the aggregator asks for a
job-wide dump. Never blocks: a FIFO without a reader is skipped.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class TriggerResult:
    triggered: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # no pipe for that rank
    failed: dict[int, str] = field(default_factory=dict)  # pipe present but not writable now


def pipe_path(prefix: str, rank: int) -> str | None:
    """The rank's dump pipe: ``<prefix><rank>.pipe`` (PyTorch's name) or ``<prefix><rank>``."""
    for path in (f"{prefix}{rank}.pipe", f"{prefix}{rank}"):
        try:
            if stat.S_ISFIFO(os.stat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def trigger_dumps(prefix: str, ranks: Iterable[int]) -> TriggerResult:
    """Write one byte into each rank's dump pipe (non-blocking)."""
    result = TriggerResult()
    for rank in ranks:
        path = pipe_path(prefix, rank)
        if path is None:
            result.missing.append(rank)
            continue
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            result.failed[rank] = "no reader" if exc.errno == errno.ENXIO else (exc.strerror or str(exc))
            continue
        try:
            os.write(fd, b"1\n")
            result.triggered.append(rank)
        except OSError as exc:
            result.failed[rank] = exc.strerror or str(exc)
        finally:
            os.close(fd)
    return result

"""One small sysfs file read the same way everywhere: never blocking, only a regular file, bounded in size.

A FIFO (or a device) under ``--sysfs-root`` would block a plain ``open``/``read`` for ever — the daemon reads
sysfs in a worker with a deadline, but ``sentinel agent once`` reads it on its only thread. So files are
opened with ``O_NONBLOCK`` and must be regular files (sysfs attributes are); anything else is an OSError
naming what it is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_small(path: Path, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` bytes of the regular file at ``path``; OSError for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)

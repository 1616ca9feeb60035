"""Have the kernel read the next dumps from disk while this process decodes the current one.

A set that is not in the page cache is otherwise read one synchronous read at a time while the decoding
core idles. :class:`ReadAhead` follows one worker's dumps in order: once ``load_dump``'s ``RWF_NOWAIT``
probe finds a dump not cached, each call hints (``posix_fadvise(WILLNEED)``) the dump ``ahead`` places on,
over the extents the last decode read. Hints open files as :func:`~sentinel.fr.loader.open_regular` does
and ignore every error: the decode checks each file itself.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

from sentinel.fr.recent import ByteView

#: Dumps hinted ahead of the one being decoded: a dump decodes in about the time a disk read takes, so a
#: few dumps ahead keep the disk busy while the core decodes.
AHEAD = 8
#: Most bytes hinted at either end of a file (what a hostile dump's decode read must not grow unbounded).
MAX_EXTENT = 4 << 20

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_WILLNEED: int = getattr(os, "POSIX_FADV_WILLNEED", 0) if hasattr(os, "posix_fadvise") else 0  # 0: none


class ReadAhead:
    """One decoding process's read-ahead: call it before each dump with the batch's paths and the dump's
    index in them; ``load_dump(..., read_ahead=)`` reports what it found and read."""

    __slots__ = ("_batch", "_upto", "ahead", "back", "cold", "front", "hints")

    def __init__(self, ahead: int = AHEAD) -> None:
        self.ahead = ahead
        self.cold = False  # a dump's first bytes were not in the page cache: hints are on
        # bytes of a large dump's front and back the last decode read (at first: what ByteView reads first)
        self.front = ByteView.CHUNK
        self.back = ByteView.CHUNK // 2
        self.hints = 0  # files hinted so far
        self._batch: Sequence[str] | None = None
        self._upto = 0  # the batch's paths before this index were hinted

    def __call__(self, paths: Sequence[str], index: int) -> None:
        """``paths[index]`` is decoded next: hint up to ``ahead`` dumps after it, once the set is cold."""
        if not self.cold or not _WILLNEED:
            return
        if paths is not self._batch:
            self._batch, self._upto = paths, 0
        stop = min(len(paths), index + 1 + self.ahead)
        for i in range(max(self._upto, index + 1), stop):
            self._hint(paths[i])
        self._upto = max(self._upto, stop)

    def first_bytes(self, fd: int, n: int) -> bytes:
        """The file's first ``n`` bytes, noting whether they were in the page cache (a read that would
        wait for the disk returns EAGAIN with ``RWF_NOWAIT``: then it is read the usual way)."""
        if _NOWAIT:
            buf = bytearray(n)
            try:
                got = os.preadv(fd, [buf], 0, _NOWAIT)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    self.cold = True
                # anything else (a file system without RWF_NOWAIT): read as without read-ahead
            else:
                if got == n:
                    return bytes(buf)
                # short: an empty or tiny file, or part of it not cached; the plain read decides
        return os.pread(fd, n, 0)

    def decoded(self, front: int, back: int) -> None:
        """What the decode of a large dump read of its two ends (the whole file: its size and 0)."""
        self.front = min(front, MAX_EXTENT)
        self.back = min(back, MAX_EXTENT)

    def _hint(self, path: str) -> None:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            size = st.st_size
            if size <= self.front + self.back:
                os.posix_fadvise(fd, 0, size, _WILLNEED)
            else:
                os.posix_fadvise(fd, 0, self.front, _WILLNEED)
                if self.back:  # (a length of 0 would mean "to the end")
                    os.posix_fadvise(fd, size - self.back, self.back, _WILLNEED)
            self.hints += 1
        except OSError:
            pass
        finally:
            os.close(fd)

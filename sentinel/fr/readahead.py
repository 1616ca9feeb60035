"""Have the kernel read the next dumps from disk while this process decodes the current one.

A dump set that is not in the page cache (copied in from the cluster's storage, evicted by other work,
the first look after a job died) is read from disk: every dump by a few synchronous reads of its two
ends (:class:`~sentinel.fr.recent.ByteView`) or one read of a small file, each waiting for the disk while
the decoding core idles — a 16,384-rank set took 12.8-13.2 s from disk against 6.1 s cached.

:class:`ReadAhead` follows one decoding process's dumps in their order. ``load_dump`` probes whether a
dump's first bytes were in the page cache (one ``RWF_NOWAIT`` read, ~0.4 us, that also serves as the
read of the format's magic bytes) and tells what the decode read of a large dump. Once a probe found a
dump on disk, every call hints the dump ``ahead`` places further on: ``posix_fadvise(WILLNEED)`` over
what decoding it will read — the whole of a small file, the two ends of a large one as far as the last
large dump's decode read them (its front up to the last one's size where that was read whole: JSON,
gzip) — which starts the disk reads and returns at once. The dumps of one set are alike, so the last
one's extents are the next one's. A set in the cache pays the probe alone, never an extra open.

Hints are only hints: the decode opens and checks each file itself (:func:`~sentinel.fr.loader.open_regular`),
so a hint opens the file the same way (no symlink followed, no FIFO waited on, only a regular file
advised) and ignores every error.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

from sentinel.fr.recent import ByteView

#: Dumps hinted ahead of the one being decoded: a dump decodes in ~0.3-1 ms, a disk read takes ~0.3 ms.
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

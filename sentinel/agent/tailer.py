"""Follow NCCL / PyTorch log files: configured globs, new files, rotation, truncation, bounded lines.

Each poll re-expands the globs (every ``rescan_s``), then reads what was appended to every followed file.

- A file present at start is followed from its end (old lines were seen before, or are history); a file
  that appears later is read from its beginning (a new rank's NCCL_DEBUG_FILE).
- Rotation (the path now names another inode): the old file is read to its end, then the new one from its
  start. A file that vanished is dropped after its last lines were read.
- Truncation (size below our offset, ``copytruncate``): read again from the start.
- Lines longer than ``max_line_bytes`` are cut and counted; a partial last line waits for its newline.
- Only regular files are followed, opened with ``O_NOFOLLOW``: a path that is (or became) a symbolic link
  is refused — logged once, counted in ``refused_files`` — so a followed log swapped for a link to another
  file is never read through it.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from dataclasses import dataclass, field

from sentinel.log import get_logger

log = get_logger(module="agent.tailer")


@dataclass
class _Followed:
    path: str
    fd: int
    inode: tuple[int, int]
    offset: int = 0
    partial: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # inside an over-long line whose head was already emitted


class LogTailer:
    """Poll-driven tail -F over a set of glob patterns."""

    def __init__(
        self,
        globs: list[str],
        *,
        rescan_s: float = 5.0,
        max_line_bytes: int = 8192,
        max_bytes_per_poll: int = 4 * 1024 * 1024,
        max_files: int = 1024,
    ) -> None:
        self.globs = list(globs)
        self.rescan_s = rescan_s
        self.max_line_bytes = max_line_bytes
        self.max_bytes_per_poll = max_bytes_per_poll
        self.max_files = max_files
        self._files: dict[str, _Followed] = {}
        self._retired: list[_Followed] = []  # rotated away: read to their end, then closed
        self._next_scan = 0.0
        self._started = False
        self.cut_lines = 0
        self.errors = 0
        self.refused_files = 0  # paths refused: symbolic links, not regular files (each counted once)
        self._refused: set[str] = set()

    @property
    def files(self) -> list[str]:
        return sorted(self._files)

    def close(self) -> None:
        for followed in [*self._files.values(), *self._retired]:
            os.close(followed.fd)
        self._files.clear()
        self._retired.clear()

    def poll(self, now: float) -> list[tuple[str, str]]:
        """(path, line) pairs appended since the last poll; never raises."""
        if now >= self._next_scan:
            self._scan(from_end=not self._started)
            self._started = True
            self._next_scan = now + self.rescan_s
        out: list[tuple[str, str]] = []
        for followed in self._retired:
            self._read(followed, out, final=True)
            os.close(followed.fd)
        self._retired.clear()
        for followed in list(self._files.values()):
            self._check_rotation(followed, out)
            self._read(followed, out, final=False)
        return out

    def _scan(self, *, from_end: bool) -> None:
        seen: set[str] = set()
        for pattern in self.globs:
            try:
                matches = glob.glob(pattern, recursive=True)
            except (OSError, ValueError) as exc:
                self.errors += 1
                log.warning("log_glob_failed", pattern=pattern, error=str(exc))
                continue
            for path in matches:
                seen.add(path)
                if path not in self._files and len(self._files) < self.max_files:
                    self._follow(path, from_end=from_end)
        for path in list(self._files):
            if path not in seen and not os.path.exists(path):
                self._retired.append(self._files.pop(path))

    def _follow(self, path: str, *, from_end: bool) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            st = os.fstat(fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._refuse(path, "a symbolic link")
                return
            self.errors += 1
            log.warning("log_open_failed", path=path, error=exc.strerror or str(exc))
            return
        if not _is_regular(st.st_mode):
            os.close(fd)
            self._refuse(path, "not a regular file")
            return
        self._refused.discard(path)
        offset = st.st_size if from_end else 0
        os.lseek(fd, offset, os.SEEK_SET)
        self._files[path] = _Followed(path=path, fd=fd, inode=(st.st_dev, st.st_ino), offset=offset)

    def _refuse(self, path: str, what: str) -> None:
        if path not in self._refused:
            self._refused.add(path)
            self.refused_files += 1
            log.warning("log_file_refused", path=path, detail=f"{what}: only regular files are followed")

    def _check_rotation(self, followed: _Followed, out: list[tuple[str, str]]) -> None:
        try:
            st = os.lstat(followed.path)
        except FileNotFoundError:
            return  # moved away and not yet recreated: keep reading the old inode; the scan retires it
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):  # swapped for a link: the old file is read to its end, the link never
            self._read(followed, out, final=True)
            os.close(followed.fd)
            del self._files[followed.path]
            self._refuse(followed.path, "a symbolic link now")
            return
        if (st.st_dev, st.st_ino) != followed.inode:
            self._read(followed, out, final=True)
            os.close(followed.fd)
            del self._files[followed.path]
            self._follow(followed.path, from_end=False)
            return
        if st.st_size < followed.offset:
            os.lseek(followed.fd, 0, os.SEEK_SET)
            followed.offset = 0
            followed.partial.clear()
            followed.skipping = False

    def _read(self, followed: _Followed, out: list[tuple[str, str]], *, final: bool) -> None:
        budget = self.max_bytes_per_poll
        while budget > 0:
            try:
                chunk = os.read(followed.fd, min(65536, budget))
            except OSError as exc:
                self.errors += 1
                log.warning("log_read_failed", path=followed.path, error=exc.strerror or str(exc))
                return
            if not chunk:
                break
            budget -= len(chunk)
            followed.offset += len(chunk)
            self._lines(followed, chunk, out)
        if final and followed.partial and not followed.skipping:
            out.append((followed.path, followed.partial.decode("utf-8", "replace")))
            followed.partial.clear()

    def _lines(self, followed: _Followed, chunk: bytes, out: list[tuple[str, str]]) -> None:
        start = 0
        limit = self.max_line_bytes
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not followed.skipping:
                room = limit - len(followed.partial)
                if len(piece) > room:
                    followed.partial += piece[:room]
                    out.append((followed.path, followed.partial.decode("utf-8", "replace").rstrip("\r")))
                    followed.partial.clear()
                    followed.skipping = True
                    self.cut_lines += 1
                else:
                    followed.partial += piece
            if end < 0:
                return
            if not followed.skipping:
                out.append((followed.path, followed.partial.decode("utf-8", "replace").rstrip("\r")))
            followed.partial.clear()
            followed.skipping = False
            start = end + 1


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)

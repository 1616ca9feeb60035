"""Who listens on the RAS port: the agent asks RAS only when the listener is one it may trust.

NCCL's RAS service listens on a fixed local port (28028). When no job's RAS thread holds it, any local user
may listen there and answer whatever it likes, for any job. So before a query the agent finds the port's
listening sockets in ``/proc/net/tcp`` and ``tcp6`` (state ``0A``; the kernel lists listening sockets before
any other) with the uid the kernel records as each one's owner, and trusts the listener only when that uid
is root or the uid of a process of the job it asks for on this host (:func:`listener_trusted`). The /proc
reading is behind :class:`SocketTable` so tests can present a foreign listener; :class:`ProcSocketTable` is
the real one, bounded in lines read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: lines of each /proc/net/tcp* file read at most (the listening sockets come first)
MAX_TABLE_LINES = 65536
_LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class Listener:
    """A listening TCP socket on the RAS port: its owner's uid and its inode."""

    uid: int
    inode: int


class SocketTable(Protocol):
    """What the agent may ask the OS about sockets and processes."""

    def listeners(self, port: int) -> list[Listener]: ...

    def uid_of(self, pid: int) -> int | None: ...


def parse_listeners(text: str, port: int, max_lines: int = MAX_TABLE_LINES) -> list[Listener]:
    """The listening sockets on ``port`` in a /proc/net/tcp(6) table; lines that do not parse are skipped."""
    found: list[Listener] = []
    for number, line in enumerate(text.splitlines()):
        if number == 0:
            continue  # the header
        if number > max_lines:
            break
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state = fields[1], fields[3]
        if state != _LISTEN:
            break  # listening sockets are listed first: the rest is connections
        _, _, hex_port = local.rpartition(":")
        try:
            if int(hex_port, 16) != port:
                continue
            found.append(Listener(uid=int(fields[7]), inode=int(fields[9])))
        except ValueError:
            continue
    return found


class ProcSocketTable:
    """The real table: ``/proc/net/tcp`` and ``tcp6`` (blocking reads: call it off the event loop)."""

    def __init__(self, proc: str | Path = "/proc") -> None:
        self.proc = Path(proc)

    def listeners(self, port: int) -> list[Listener]:
        found: list[Listener] = []
        for name in ("tcp", "tcp6"):
            found.extend(parse_listeners(_head(self.proc / "net" / name, MAX_TABLE_LINES), port))
        return found

    def uid_of(self, pid: int) -> int | None:
        try:
            return os.stat(self.proc / str(pid)).st_uid
        except OSError:
            return None


def _head(path: Path, max_lines: int) -> str:
    """The first lines of a /proc table, up to the first connection line after the listeners."""
    lines: list[str] = []
    try:
        with path.open(encoding="ascii", errors="replace") as handle:
            for number, line in enumerate(handle):
                lines.append(line)
                fields = line.split()
                if number > max_lines or (number > 0 and len(fields) > 3 and fields[3] != _LISTEN):
                    break
    except OSError:
        return ""
    return "".join(lines)


@dataclass(frozen=True, slots=True)
class Trust:
    """The verdict on the port's listeners: trusted, or why not."""

    trusted: bool
    uids: tuple[int, ...]  # the listeners' owners
    why: str


def listener_trusted(table: SocketTable, port: int, job_pids: Iterable[int]) -> Trust:
    """Trusted when every listener on ``port`` is owned by root or by the uid of one of ``job_pids``
    (the queried job's processes on this host). No listener at all is not trusted either: nothing to ask."""
    listeners = table.listeners(port)
    uids = tuple(sorted({listener.uid for listener in listeners}))
    if not listeners:
        return Trust(False, uids, "nothing listens on the port")
    job_uids = {uid for pid in job_pids if (uid := table.uid_of(pid)) is not None}
    foreign = [uid for uid in uids if uid != 0 and uid not in job_uids]
    if foreign:
        return Trust(
            False,
            uids,
            f"listener owned by uid {foreign[0]}, neither root nor a user of the job's processes "
            f"(uids {sorted(job_uids)})",
        )
    return Trust(True, uids, "")

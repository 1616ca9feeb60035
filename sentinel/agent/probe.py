"""The local socket on which training processes hand over their flight-recorder heads.

A unix ``SOCK_DGRAM`` socket: one msgpack-encoded :class:`sentinel.fr.heads.FrHeads` per datagram, so a
training process never blocks on the agent (a full socket buffer drops the datagram on the sender's side,
which ``sentinel.probe`` counts) and never has to manage a connection. Datagrams are size-bounded and
validated; anything else is counted and dropped. The agent fills in ``host`` and ``gpu`` from its
process → GPU mapping before forwarding.

Who sends is known, not claimed: the socket is mode 0660 by default and ``SO_PASSCRED`` makes the kernel
attach the sender's pid/uid to every datagram. :class:`HeadsAuthorizer` checks them against the job's
processes: a process the agent maps to a job may only speak for that job (and its pid is the kernel's, not
the one in the heads); a job's heads from any other process must come from the user its processes run as;
a job the agent has no process of belongs to the first user that spoke for it. Root may speak for any job.
The receive path is bounded per wake-up and in bytes queued, so a datagram flood cannot grow the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import stat
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from sentinel.agent.jobs import owner_uid
from sentinel.fr.heads import FrHeads
from sentinel.log import get_logger
from sentinel.wire import ProcInfo

log = get_logger(module="agent.probe")

_decoder = msgspec.msgpack.Decoder(FrHeads)


class ProbeError(ValueError):
    """A datagram that is not a valid FrHeads."""


def decode_heads(data: bytes, max_bytes: int) -> FrHeads:
    """Validate one datagram; raise :class:`ProbeError` naming what is wrong."""
    if len(data) > max_bytes:
        raise ProbeError(f"datagram of {len(data)} bytes exceeds {max_bytes}")
    try:
        heads = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProbeError(f"not an FrHeads: {exc}") from None
    if not math.isfinite(heads.t) or heads.rank < 0 or len(heads.pgs) > 4096:
        raise ProbeError("FrHeads out of range (t not finite, negative rank or too many groups)")
    return heads


@dataclass(frozen=True, slots=True)
class Credentials:
    """The sender of a datagram, as the kernel reports it (``SCM_CREDENTIALS``)."""

    pid: int
    uid: int
    gid: int


_UCRED = struct.Struct("3i")
MAX_OWNED_JOBS = 4096


class HeadsAuthorizer:
    """Decides whether the sender of a datagram may speak for the job its heads name (see the module doc)."""

    def __init__(
        self, procs: Callable[[], Iterable[ProcInfo]], owner_uid: Callable[[int], int | None] = owner_uid
    ) -> None:
        self.procs = procs
        self.owner_uid = owner_uid
        self._owners: OrderedDict[str, int] = OrderedDict()  # job → uid, for jobs without a mapped process

    def check(self, creds: Credentials | None, heads: FrHeads) -> tuple[FrHeads | None, str]:
        """(heads to keep, with the kernel's pid where it matters; None and why when refused)."""
        if creds is None:
            return None, "no sender credentials"
        if creds.uid == 0:
            return heads, ""
        procs = list(self.procs())
        mine = next((p for p in procs if p.pid == creds.pid), None)
        if mine is not None and mine.job_id is not None:
            if heads.job_id is not None and heads.job_id != mine.job_id:
                return None, f"pid {creds.pid} runs job {mine.job_id!r}, not {heads.job_id[:80]!r}"
            if heads.rank is not None and mine.rank is not None and heads.rank != mine.rank:
                return None, f"pid {creds.pid} is rank {mine.rank}, not {heads.rank}"
            if heads.pid == creds.pid and heads.job_id == mine.job_id:
                return heads, ""  # what the replace below would make (heads are frozen)
            return msgspec.structs.replace(heads, pid=creds.pid, job_id=mine.job_id), ""
        job = heads.job_id
        if job is None:
            return _with_pid(heads, creds.pid), ""
        owners = {self.owner_uid(p.pid) for p in procs if p.job_id == job} - {None}
        if owners:
            if creds.uid not in owners:
                return None, f"uid {creds.uid} (pid {creds.pid}) may not speak for job {job[:80]!r}"
            return _with_pid(heads, creds.pid), ""
        owner = self._owners.get(job)
        if owner is None:
            self._owners[job] = owner = creds.uid
            if len(self._owners) > MAX_OWNED_JOBS:
                self._owners.popitem(last=False)
        else:
            self._owners.move_to_end(job)
        if owner != creds.uid:
            return None, f"job {job[:80]!r} is spoken for by uid {owner}, not uid {creds.uid}"
        return _with_pid(heads, creds.pid), ""


def _with_pid(heads: FrHeads, pid: int) -> FrHeads:
    """``heads`` with the kernel's pid of its sender (the same object when it says so already)."""
    return heads if heads.pid == pid else msgspec.structs.replace(heads, pid=pid)


def _decoded_size(heads: FrHeads, raw: int) -> int:
    """About what the decoded heads hold in memory: a rank number costs ~36 bytes as a Python int in a list
    (one byte in msgpack), so the queue is bounded by this, not by the datagram's size (12x smaller)."""
    items = 0
    for pg in heads.pgs:
        items += len(pg.ranks or ()) + len(pg.in_flight)
    return max(raw, 36 * items + 512 * len(heads.pgs))


class ProbeServer:
    """Receives FrHeads datagrams into a queue bounded in count and bytes, drained once per tick."""

    #: datagrams read per wake-up of the event loop at most (the loop serves everything else in between)
    BURST = 256

    def __init__(
        self,
        path: str,
        *,
        max_bytes: int = 65536,
        max_pending: int = 4096,
        max_pending_bytes: int = 4 * 1024 * 1024,
        mode: int = 0o660,
        group: str = "",
        authorizer: HeadsAuthorizer | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self.mode = mode
        self.group = group
        self.authorizer = authorizer or HeadsAuthorizer(list)
        self._pending: deque[tuple[FrHeads, int]] = deque(maxlen=max_pending)
        self._pending_bytes = 0
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.received = 0
        self.rejected = 0
        self.refused = 0  # valid heads from a sender that may not speak for their job
        self.overflowed = 0

    def __len__(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # left over from a previous run
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(self.path)
            os.chmod(self.path, self.mode)
            if self.group:
                import grp

                try:
                    gid = grp.getgrnam(self.group).gr_gid
                except KeyError:
                    raise OSError(f"probe.socket_group {self.group!r}: no such group") from None
                os.chown(self.path, -1, gid)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        space = socket.CMSG_SPACE(_UCRED.size)
        for _ in range(self.BURST):
            try:
                data, ancillary, flags, _ = sock.recvmsg(self.max_bytes + 1, space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("probe_socket_error", socket=self.path, error=exc.strerror or str(exc))
                return
            creds = None
            for level, kind, value in ancillary:
                if (
                    level == socket.SOL_SOCKET
                    and kind == socket.SCM_CREDENTIALS
                    and len(value) >= _UCRED.size
                ):
                    creds = Credentials(*_UCRED.unpack(value[: _UCRED.size]))
            if flags & socket.MSG_TRUNC:
                data = data + b"\0"  # longer than max_bytes: refused by size below
            self.receive(data, creds)

    def receive(self, data: bytes, creds: Credentials | None = None) -> None:
        try:
            heads = decode_heads(data, self.max_bytes)
        except ProbeError as exc:
            self.rejected += 1
            if self.rejected <= 10 or self.rejected % 1000 == 0:
                log.warning(
                    "probe_datagram_rejected", socket=self.path, problem=str(exc), rejected=self.rejected
                )
            return
        kept, problem = self.authorizer.check(creds, heads)
        if kept is None:
            self.rejected += 1
            self.refused += 1
            if self.refused <= 10 or self.refused % 1000 == 0:
                log.warning(
                    "probe_heads_refused",
                    socket=self.path,
                    problem=problem,
                    pid=creds.pid if creds else None,
                    uid=creds.uid if creds else None,
                    refused=self.refused,
                )
            return
        size = _decoded_size(kept, len(data))
        while self._pending and (
            len(self._pending) == self._pending.maxlen or self._pending_bytes + size > self.max_pending_bytes
        ):
            _, dropped = self._pending.popleft()  # the oldest go first: the newest heads are the present
            self._pending_bytes -= dropped
            self.overflowed += 1
        self._pending.append((kept, size))
        self._pending_bytes += size
        self.received += 1

    def drain(self) -> list[FrHeads]:
        out = [heads for heads, _ in self._pending]
        self._pending.clear()
        self._pending_bytes = 0
        return out

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

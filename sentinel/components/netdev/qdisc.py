"""Each interface's root queueing discipline from rtnetlink: the wait a plain interface has no counter for.

A link that cannot carry what is offered (shaped, congested, a slow peer) shows in its egress queue, not in
``statistics/``: the qdisc's ``overlimits`` (a packet had to wait for the shaper), ``drops`` and
``requeues`` counters and its ``backlog``. One ``RTM_GETQDISC`` dump over a ``NETLINK_ROUTE`` socket;
:func:`parse_dump` is pure (fuzzed), the socket has a deadline and every count and size is bounded. Only
root qdiscs are kept (``mq`` and the classful ones report their children's sum at the root).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgspec

NETLINK_ROUTE = 0
RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND = 1
TCA_STATS = 3
TCA_STATS2 = 7
TCA_STATS_QUEUE = 3
CLONE_NEWNET = 0x40000000

MAX_DUMP_BYTES = 1 << 20
MAX_QDISCS = 1024
_NLMSG = struct.Struct("=LHHLL")
_TCMSG = struct.Struct("=BxxxiLLL")
_RTA = struct.Struct("=HH")
_QUEUE = struct.Struct("=LLLLL")  # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
_OLD_STATS = struct.Struct(
    "=QLLLLLLL"
)  # tc_stats: bytes, packets, drops, overlimits, bps, pps, qlen, backlog


class QdiscStats(msgspec.Struct, frozen=True, kw_only=True):
    """One interface's root qdisc."""

    ifindex: int
    kind: str
    drops: int = 0
    overlimits: int = 0
    requeues: int = 0
    backlog_bytes: int = 0
    qlen: int = 0


class NetlinkFormatError(ValueError):
    """A netlink answer that is not what the kernel writes."""


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    off = 0
    while off + _RTA.size <= len(data):
        length, kind = _RTA.unpack_from(data, off)
        if length < _RTA.size or off + length > len(data):
            raise NetlinkFormatError(f"attribute length {length} out of bounds")
        yield kind & 0x3FFF, data[off + _RTA.size : off + length]
        off += _align(length)


def _qdisc(body: bytes) -> QdiscStats | None:
    if len(body) < _TCMSG.size:
        raise NetlinkFormatError("tcmsg truncated")
    _family, ifindex, _handle, parent, _info = _TCMSG.unpack_from(body)
    if parent != TC_H_ROOT or ifindex <= 0:
        return None
    kind = ""
    queue: tuple[int, ...] | None = None
    old: tuple[int, ...] | None = None
    for attr, value in _attrs(body[_TCMSG.size :]):
        if attr == TCA_KIND:
            kind = value.split(b"\0", 1)[0][:16].decode("ascii", "replace")
        elif attr == TCA_STATS2:
            for sub, inner in _attrs(value):
                if sub == TCA_STATS_QUEUE and len(inner) >= _QUEUE.size:
                    queue = _QUEUE.unpack_from(inner)
        elif attr == TCA_STATS and len(value) >= _OLD_STATS.size:
            old = _OLD_STATS.unpack_from(value)
    if queue is not None:
        qlen, backlog, drops, requeues, overlimits = queue
    elif old is not None:
        _bytes, _packets, drops, overlimits, _bps, _pps, qlen, backlog = old
        requeues = 0
    else:
        return QdiscStats(ifindex=ifindex, kind=kind)
    return QdiscStats(
        ifindex=ifindex,
        kind=kind,
        drops=drops,
        overlimits=overlimits,
        requeues=requeues,
        backlog_bytes=backlog,
        qlen=qlen,
    )


def parse_dump(data: bytes) -> tuple[list[QdiscStats], bool]:
    """The root qdiscs in a chunk of the dump's answer, and whether the dump is done (``NLMSG_DONE``)."""
    out: list[QdiscStats] = []
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size or off + length > len(data):
            raise NetlinkFormatError(f"message length {length} out of bounds")
        body = data[off + _NLMSG.size : off + length]
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", body)[0] if len(body) >= 4 else -1
            if code != 0:
                raise NetlinkFormatError(f"netlink error {os.strerror(-code) if code < 0 else code}")
        elif kind == RTM_NEWQDISC:
            found = _qdisc(body)
            if found is not None and len(out) < MAX_QDISCS:
                out.append(found)
        off += _align(length)
    return out, False


def _dump(sock: socket.socket, deadline: float) -> list[QdiscStats]:
    request = _NLMSG.pack(_NLMSG.size + _TCMSG.size, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    sock.send(request + _TCMSG.pack(0, 0, 0, 0, 0))
    out: list[QdiscStats] = []
    total = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("qdisc dump past its deadline")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        total += len(chunk)
        if not chunk or total > MAX_DUMP_BYTES:
            raise NetlinkFormatError("qdisc dump empty or beyond its size bound")
        found, done = parse_dump(chunk)
        out.extend(found[: MAX_QDISCS - len(out)])
        if done:
            return out


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@dataclass
class NetlinkQdiscs:
    """Reads the root qdiscs of this process's network namespace, or of ``netns`` (a path such as
    ``/run/netns/x`` or ``/proc/1/ns/net``: the calling thread enters it for the socket and comes back;
    needs CAP_SYS_ADMIN). Blocking: called from the collector's deadline worker."""

    netns: str = ""
    timeout_s: float = 1.0
    opener: Callable[[], socket.socket] | None = None

    def read(self) -> list[QdiscStats]:
        deadline = time.monotonic() + self.timeout_s
        with self._socket() as sock:
            return _dump(sock, deadline)

    def _open(self) -> socket.socket:
        if self.opener is not None:
            return self.opener()
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)

    @contextlib.contextmanager
    def _socket(self) -> Iterator[socket.socket]:
        if not self.netns:
            sock = self._open()
        else:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                target = os.open(self.netns, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _setns(target)
                    try:
                        sock = self._open()
                    finally:
                        _setns(home)
                finally:
                    os.close(target)
            finally:
                os.close(home)
        try:
            yield sock
        finally:
            sock.close()

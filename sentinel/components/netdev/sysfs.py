"""Read ``class/net/<name>/{operstate,speed,statistics/*}`` under a sysfs root, bounded.

Every file is opened ``O_NONBLOCK`` and must be a regular file; at most :data:`MAX_NETDEVS` interfaces,
:data:`MAX_COUNTERS` counters each, :data:`MAX_FILE_BYTES` per file. Loopback carries no traffic between
hosts and is left out. A file that cannot be read or parsed is named in the scan's errors and the rest of
the interface is still reported. Blocking file I/O: the collector runs it in its deadline worker.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from sentinel.components.netdev.qdisc import NetlinkFormatError, QdiscStats
from sentinel.components.netdev.record import MAX_NETDEVS, READ_COUNTERS, NetdevReading

MAX_COUNTERS = 64
MAX_FILE_BYTES = 256
_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,32}$")
_OPERSTATE = re.compile(r"^[a-z]{1,20}$")
LOOPBACK = "lo"


class NetdevFormatError(ValueError):
    """A file whose content is not what the kernel writes there."""


def read_small(path: str | Path) -> str:
    """A sysfs attribute's text: a regular file, opened non-blocking, at most :data:`MAX_FILE_BYTES`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NetdevFormatError("not a regular file")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise NetdevFormatError(f"larger than {MAX_FILE_BYTES} bytes")
    return data.decode("ascii", "replace").strip()


def parse_counter(text: str) -> int:
    """One unsigned decimal integer of at most 64 bits."""
    value = text.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 20 or int(value) >= 1 << 64:
        raise NetdevFormatError(f"not an unsigned 64-bit integer: {value[:40]!r}")
    return int(value)


def parse_speed(text: str) -> int | None:
    """``speed`` in Mb/s; ``-1`` (unknown, link down) is None."""
    value = text.strip()
    if value == "-1":
        return None
    return parse_counter(value)


def _names(directory: str | Path, limit: int) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(directory) if _NAME.match(n))
    except OSError:
        return []
    return names[:limit]


@dataclass
class NetdevScan:
    netdevs: list[NetdevReading] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class QdiscReader(Protocol):
    def read(self) -> list[QdiscStats]: ...


class SysfsNetdevs:
    """The interface source of a real host (``read()`` is blocking: run it off the event loop); ``qdiscs``
    adds each interface's root qdisc (matched by ``ifindex``)."""

    def __init__(self, root: str | Path = "/sys", qdiscs: QdiscReader | None = None) -> None:
        self.root = Path(root)
        self.qdiscs = qdiscs

    def read(self) -> NetdevScan:
        scan = NetdevScan()
        base = self.root / "class" / "net"
        names = [n for n in _names(base, MAX_NETDEVS + 2) if n != LOOPBACK]
        if len(names) > MAX_NETDEVS:
            scan.errors.append(f"{base}: more than {MAX_NETDEVS} interfaces, the rest ignored")
            names = names[:MAX_NETDEVS]
        for name in names:
            reading = self._one(f"{base}/{name}", name, scan)
            if reading is not None:
                scan.netdevs.append(reading)
        if self.qdiscs is not None and scan.netdevs:
            try:
                roots = {q.ifindex: q for q in self.qdiscs.read()}
            except (OSError, NetlinkFormatError) as exc:
                scan.errors.append(f"qdisc dump: {getattr(exc, 'strerror', None) or exc}")
            else:
                scan.netdevs = [_with_qdisc(r, roots.get(r.ifindex)) for r in scan.netdevs]
        return scan

    @staticmethod
    def _one(path: str, name: str, scan: NetdevScan) -> NetdevReading | None:
        # plain strings, not Paths: a few dozen files an interface, every read
        stats = f"{path}/statistics"
        counter_names = _names(stats, MAX_COUNTERS + 1)
        if not counter_names:
            return None  # not an interface directory (or one without statistics): nothing to judge
        if len(counter_names) > MAX_COUNTERS:
            scan.errors.append(f"{stats}: more than {MAX_COUNTERS} counters, the rest ignored")
            counter_names = counter_names[:MAX_COUNTERS]
        counters: dict[str, int] = {}
        for counter in counter_names:
            if counter not in READ_COUNTERS:
                continue
            try:
                counters[counter] = parse_counter(read_small(f"{stats}/{counter}"))
            except (OSError, NetdevFormatError) as exc:
                scan.errors.append(f"{stats}/{counter}: {getattr(exc, 'strerror', None) or exc}")
        operstate = ""
        try:
            text = read_small(f"{path}/operstate")
            operstate = text if _OPERSTATE.match(text) else ""
        except (OSError, NetdevFormatError) as exc:
            scan.errors.append(f"{path}/operstate: {getattr(exc, 'strerror', None) or exc}")
        speed: int | None = None
        # virtual devices and downed links refuse speed (EINVAL): no speed, no problem
        with contextlib.suppress(OSError, NetdevFormatError):
            speed = parse_speed(read_small(f"{path}/speed"))
        ifindex = 0
        with contextlib.suppress(OSError, NetdevFormatError):
            ifindex = parse_counter(read_small(f"{path}/ifindex")) & 0x7FFFFFFF
        return NetdevReading(
            name=name, operstate=operstate, speed_mbps=speed, counters=counters, ifindex=ifindex
        )


def _with_qdisc(reading: NetdevReading, q: QdiscStats | None) -> NetdevReading:
    if q is None or reading.ifindex <= 0:
        return reading
    counters = {
        **reading.counters,
        "qdisc_overlimits": q.overlimits,
        "qdisc_drops": q.drops,
        "qdisc_requeues": q.requeues,
    }
    return msgspec.structs.replace(
        reading, counters=counters, qdisc=q.kind, qdisc_backlog_bytes=q.backlog_bytes
    )

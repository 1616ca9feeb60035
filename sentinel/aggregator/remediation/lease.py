"""Who of two (or more) aggregators acts on Slurm: a lease in a file both can lock.

Both aggregators of an HA pair reach the same verdicts; reading Slurm before acting keeps a drain from being
done twice one after the other, but two aggregators deciding in the same instant would both see the node
idle and both drain it (and both pass a breaker that had room for one). So one holds the lease and acts; the
other follows. The lease is a small JSON record (``holder``, ``until``) in ``remediation.lease_file``, on
storage both aggregator hosts mount — Slurm's own HA needs such a place for its StateSaveLocation — read and
replaced under an exclusive POSIX lock (``lockf``: NFS carries it), so taking and renewing are atomic.

Safety by time, not by trust: the holder renews every third of ``lease_s`` and starts an action only while
its lease runs (``until`` not passed); another may take the lease only ``grace_s`` after ``until`` — the
remediation command deadline — so a command the old holder started in time has finished or been killed
before the new holder's first read of Slurm. The hosts' clocks must agree to well under ``grace_s`` (NTP).
A holder that dies, hangs or loses the storage is replaced after at most ``lease_s + grace_s``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

MAX_LEASE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class LeaseState:
    holder: str
    until: float


class LeaseFile:
    """The lease record in one file; :meth:`hold` takes or renews it (blocking I/O: call it off the loop)."""

    def __init__(self, path: Path, holder: str, lease_s: float, grace_s: float) -> None:
        self.path = path
        self.holder = holder
        self.lease_s = lease_s
        self.grace_s = grace_s

    def read(self) -> LeaseState | None:
        """The record as it is (None: no file, or not a record this code wrote)."""
        try:
            with self.path.open("rb") as f:
                return _parse(f.read(MAX_LEASE_BYTES))
        except FileNotFoundError:
            return None

    def hold(self, now: float) -> LeaseState:
        """Take the lease if it is free (absent, ours, or expired ``grace_s`` ago), renew it if ours.

        Returns the record after the call: ours when ``holder`` is this one. Raises OSError when the file
        cannot be opened, locked or written (the caller then does not act).
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            try:
                current = _parse(os.pread(fd, MAX_LEASE_BYTES, 0))
                free = current is None or current.holder == self.holder or now > current.until + self.grace_s
                if not free:
                    assert current is not None
                    return current
                taken = LeaseState(self.holder, now + self.lease_s)
                data = json.dumps({"holder": taken.holder, "until": taken.until}).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
                return taken
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the lease up now (a clean stop), so the other takes over without waiting for it to run out."""
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                current = _parse(os.pread(fd, MAX_LEASE_BYTES, 0))
                if current is not None and current.holder == self.holder:
                    data = json.dumps({"holder": "", "until": 0.0}).encode()
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, data, 0)
                    os.fsync(fd)
            finally:
                os.close(fd)


def _parse(data: bytes) -> LeaseState | None:
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    holder, until = record.get("holder"), record.get("until")
    if not isinstance(holder, str) or not isinstance(until, int | float) or isinstance(until, bool):
        return None
    try:
        when = float(until)
    except OverflowError:  # an integer past any float: not a time this code wrote
        return None
    if not math.isfinite(when):
        return None
    return LeaseState(holder[:256], when)

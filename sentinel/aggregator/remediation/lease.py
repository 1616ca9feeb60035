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

A record whose ``until`` lies further ahead than one term (``lease_s``) plus the skew allowance (``grace_s``)
was not written by a holder whose clock agrees with ours (a clock a year ahead, a hand-edited file): it is
*invalid* (:attr:`LeaseState.invalid` says why) and its ``until`` is not believed. It is judged by the time
this reader first saw it instead: left unchanged for ``lease_s + grace_s`` it is taken over; a holder that
keeps renewing it (changing it) keeps it. The file is opened with ``O_NOFOLLOW`` and must be a regular file:
a symbolic link (which would make the holder truncate whatever it points to) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_LEASE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class LeaseState:
    holder: str
    until: float
    invalid: str = ""  # why the record is not believed ("" for a valid one)


class LeaseFileRefused(OSError):
    """The lease path is a symbolic link or not a regular file."""


def _open(path: Path, flags: int) -> int:
    """The lease file's descriptor: never through a symbolic link, only a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o640)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LeaseFileRefused(errno.ELOOP, "is a symbolic link: refused", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LeaseFileRefused(errno.EINVAL, "is not a regular file: refused", str(path))
    return fd


class LeaseFile:
    """The lease record in one file; :meth:`hold` takes or renews it (blocking I/O: call it off the loop)."""

    def __init__(self, path: Path, holder: str, lease_s: float, grace_s: float) -> None:
        self.path = path
        self.holder = holder
        self.lease_s = lease_s
        self.grace_s = grace_s
        #: an invalid record as first seen, and when (it is taken over once unchanged for a term + grace)
        self._invalid_seen: tuple[LeaseState, float] | None = None

    def read(self) -> LeaseState | None:
        """The record as it is (None: no file, or not a record this code wrote)."""
        try:
            fd = _open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return _parse(os.pread(fd, MAX_LEASE_BYTES, 0))
        finally:
            os.close(fd)

    def judge(self, current: LeaseState, now: float) -> LeaseState:
        """``current`` marked invalid when its ``until`` lies beyond one term plus the skew allowance."""
        horizon = now + self.lease_s + self.grace_s
        if current.until <= horizon:
            if self._invalid_seen is not None and self._invalid_seen[0].holder == current.holder:
                self._invalid_seen = None
            return current
        why = f"until {current.until:.0f} is {current.until - now:.0f} s ahead; a term is {self.lease_s:g} s"
        return LeaseState(current.holder, current.until, why)

    def _free(self, current: LeaseState | None, now: float) -> bool:
        if current is None or current.holder == self.holder:
            return True
        if not current.invalid:
            return now > current.until + self.grace_s
        seen = self._invalid_seen
        if seen is None or (seen[0].holder, seen[0].until) != (current.holder, current.until):
            self._invalid_seen = (current, now)  # a new (or renewed) invalid record: its term starts now
            return False
        return now > seen[1] + self.lease_s + self.grace_s

    def hold(self, now: float) -> LeaseState:
        """Take the lease if it is free (absent, ours, or expired ``grace_s`` ago), renew it if ours.

        Returns the record after the call: ours when ``holder`` is this one; another's with ``invalid`` set
        when its ``until`` is not believed. Raises OSError when the file cannot be opened (a symbolic link or
        not a regular file: :class:`LeaseFileRefused`), locked or written (the caller then does not act).
        """
        fd = _open(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            try:
                current = _parse(os.pread(fd, MAX_LEASE_BYTES, 0))
                if current is not None:
                    current = self.judge(current, now)
                if not self._free(current, now):
                    assert current is not None
                    return current
                self._invalid_seen = None
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
            fd = _open(self.path, os.O_RDWR)
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

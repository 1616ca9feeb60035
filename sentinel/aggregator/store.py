"""Durable aggregator state: what must survive a restart, in SQLite (WAL) under the state directory.

An acked Xid or pending row remap is never resent, so without this store a faulty GPU would look healthy
after a restart. Anything that must survive registers as a :class:`StateHolder` (``snapshot(full)`` of its
changed typed records, ``restore``); the store never looks inside a record. Writes are behind: changes are
collected on the event loop at most ``flush_interval_s`` apart and committed by one writer thread, so
``kill -9`` loses at most one interval and SIGTERM flushes everything. See docs/aggregator.md.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol

import msgspec

from sentinel.log import get_logger

SCHEMA_VERSION = 1
#: flushes queued but not yet committed; beyond this the disk cannot keep up and flushes wait (the holders
#: keep accumulating their changes, so nothing is lost, and memory stays bounded by the state itself)
MAX_PENDING_WRITES = 8


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.store")


class StateHolder(Protocol):
    """Something whose state must survive a restart (the verdict book, a detector, the fleet's latches)."""

    @property
    def state_name(self) -> str:
        """Stable name of the holder's records in the store (a table-wide namespace)."""
        ...

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        """Records changed since the last call (all of them when ``full``); ``None`` deletes a key."""
        ...

    def restore(self, records: dict[str, bytes], now: float) -> None:
        """Take back what an earlier process snapshotted (called once, before any input)."""
        ...


class Snapshottable(Protocol):
    """What a detector offers (:class:`sentinel.aggregator.detectors.base.Detector`): memory as builtins.
    A member that also has ``memory()`` (every detector) is encoded from that: the same memory as structs
    that encode to the same bytes without building builtins first."""

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


class BuiltinsHolder:
    """A :class:`StateHolder` over objects whose memory is a dict of builtins (the detectors).

    Their memory is a warm start, not evidence (the verdicts it led to are persisted by the verdict book),
    so it is written at most every ``min_interval_s`` and only when its encoding changed; a snapshot above
    ``max_bytes`` is skipped and logged rather than letting one detector's history bloat every flush.
    ``max_bytes`` is sized from the largest memory the seeds' clusters make: the straggler's step histories of
    two 24,576-rank jobs with full windows are ~15 MB (written at most every 10 s, by the writer thread), so
    64 MiB leaves room for a few such jobs while a runaway memory is still refused.
    """

    def __init__(
        self,
        name: str,
        members: dict[str, Snapshottable],
        *,
        min_interval_s: float = 10.0,
        max_bytes: int = 64 << 20,
        clock: Any = time.monotonic,
    ) -> None:
        self.state_name = name
        self.members = members
        self.min_interval_s = min_interval_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.oversize = 0
        #: member → snapshots skipped for size (``sentinel_aggregator_state_snapshots_too_large_total``)
        self.oversize_by_member: dict[str, int] = {}
        self._next = 0.0
        self._written: dict[str, bytes] = {}
        self._prepared: dict[str, bytes] | None = None  # encoded ahead of the next flush (prepare)

    def prepare(self) -> Generator[None, None, None]:
        """Copy and encode the members' memory ahead of the flush, in steps (a member with ``memory_steps``
        yields while it copies; the caller resumes the event loop at each yield). The next non-full
        :meth:`snapshot` takes what was prepared instead of copying it in one piece on the loop. Memory is
        a warm start, so it need not be taken in the same instant as the flush's other holders."""
        now = self.clock()
        if now < self._next or self._prepared is not None:
            return
        self._next = now + self.min_interval_s
        prepared: dict[str, bytes] = {}
        for name, member in list(self.members.items()):
            steps = getattr(member, "memory_steps", None)
            memory = (yield from steps()) if steps is not None else member.snapshot()
            prepared[name] = _encoder.encode(memory)
            yield
        self._prepared = prepared

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        now = self.clock()
        prepared, self._prepared = self._prepared, None
        if full or prepared is None:
            if not full and now < self._next:
                return {}
            self._next = now + self.min_interval_s
            prepared = {}
            for name, member in self.members.items():
                memory = getattr(member, "memory", None)
                prepared[name] = _encoder.encode(memory() if memory is not None else member.snapshot())
        out: dict[str, bytes | None] = {}
        for name, data in prepared.items():
            if len(data) > self.max_bytes:
                self.oversize += 1
                self.oversize_by_member[name] = self.oversize_by_member.get(name, 0) + 1
                log().warning(
                    "state_snapshot_too_large", holder=self.state_name, member=name, bytes=len(data)
                )
                continue
            if full or self._written.get(name) != data:
                out[name] = self._written[name] = data
        return out

    def restore(self, records: dict[str, bytes], now: float) -> None:
        for name, data in records.items():
            member = self.members.get(name)
            if member is not None:
                member.restore(_decoder.decode(data))
                self._written[name] = data


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])


class StoreError(Exception):
    """The state database cannot be opened (one line naming the file and the problem)."""


#: one holder's part of a flush: its name, whether it is a full snapshot (replaces every record), changes
Write = tuple[str, bool, dict[str, bytes | None]]


class StateStore:
    """One SQLite database ``state.sqlite3``: ``records(holder, key, value)`` plus a schema version."""

    def __init__(self, state_dir: Path, *, flush_interval_s: float = 0.5) -> None:
        self.path = state_dir / "state.sqlite3"
        self.flush_interval_s = flush_interval_s
        self.holders: list[StateHolder] = []
        self.flushes = 0
        self.flushes_deferred = 0
        self.records_written = 0
        self.write_errors = 0
        self.last_flush_seconds = 0.0
        self.last_commit_at = 0.0
        self._next_flush = 0.0
        self._queue: queue.Queue[list[Write] | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._db = self._open()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open the state database: {exc}") from None
        self._writer = threading.Thread(target=self._write_loop, name="state-store-writer", daemon=True)
        self._writer.start()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS records ("
            "holder TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (holder, key))"
        )
        row = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {row[0]}, this sentinel reads {SCHEMA_VERSION}")
        return db

    # -- registration and restore ---------------------------------------------------------------------

    def register(self, holder: StateHolder, now: float) -> int:
        """Add ``holder`` and hand it what the database has for it; returns how many records it got.

        A holder whose records cannot be decoded logs the error and starts empty: a damaged state file
        must not keep the aggregator from running (the agents' fresh data rebuilds most of it).
        """
        name = holder.state_name
        rows = self._db.execute("SELECT key, value FROM records WHERE holder=?", (name,)).fetchall()
        records = {str(key): bytes(value) for key, value in rows}
        if records:
            try:
                holder.restore(records, now)
            except Exception as exc:  # a damaged or incompatible record: start over rather than not start
                self.write_errors += 1
                log().error("state_restore_failed", holder=name, records=len(records), error=str(exc)[:300])
                records = {}
                self._db.execute("DELETE FROM records WHERE holder=?", (name,))
        self.holders.append(holder)
        log().info("state_restored", holder=name, records=len(records), path=str(self.path))
        return len(records)

    # -- write-behind ---------------------------------------------------------------------------------

    def due(self, monotonic: float) -> bool:
        return monotonic >= self._next_flush

    def prepare(self) -> Generator[None, None, None]:
        """Let holders that can (:meth:`BuiltinsHolder.prepare`) build their next snapshot in steps ahead of
        :meth:`flush`; the detector loop resumes the event loop at each yield."""
        for holder in list(self.holders):
            prepare = getattr(holder, "prepare", None)
            if prepare is None:
                continue
            try:
                yield from prepare()
            except Exception as exc:  # flush() then takes the snapshot in one piece, as without this
                self.write_errors += 1
                log().error("state_snapshot_failed", holder=holder.state_name, error=str(exc)[:300])

    def flush(self, monotonic: float | None = None, *, full: bool = False) -> int:
        """Collect every holder's changes and queue them for the writer thread; returns records queued."""
        started = time.perf_counter()
        self._next_flush = (monotonic if monotonic is not None else time.monotonic()) + self.flush_interval_s
        if self._queue.qsize() >= MAX_PENDING_WRITES and not full:
            self.flushes_deferred += 1
            return 0
        writes: list[Write] = []
        count = 0
        for holder in self.holders:
            try:
                changes = holder.snapshot(full)
            except Exception as exc:  # one holder's bug must not stop the others from persisting
                self.write_errors += 1
                log().error("state_snapshot_failed", holder=holder.state_name, error=str(exc)[:300])
                continue
            if changes or full:
                writes.append((holder.state_name, full, changes))
                count += len(changes)
        if writes:
            self._idle.clear()
            self._queue.put(writes)
        self.flushes += 1
        self.last_flush_seconds = time.perf_counter() - started
        return count

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._idle.set()
                return
            try:
                self._commit(item)
            except sqlite3.Error as exc:
                self.write_errors += 1
                log().error("state_write_failed", path=str(self.path), error=str(exc)[:300])
            if self._queue.empty():
                self._idle.set()

    def _commit(self, writes: list[Write]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for name, replace, changes in writes:
                if replace:  # a full snapshot replaces everything the holder had
                    db.execute("DELETE FROM records WHERE holder=?", (name,))
                gone = [(name, key) for key, value in changes.items() if value is None]
                kept = [(name, key, value) for key, value in changes.items() if value is not None]
                if gone:
                    db.executemany("DELETE FROM records WHERE holder=? AND key=?", gone)
                if kept:
                    db.executemany("INSERT OR REPLACE INTO records VALUES (?,?,?)", kept)
                self.records_written += len(changes)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self.last_commit_at = time.time()

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until everything queued is committed (tests, shutdown)."""
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        """Flush everything, stop the writer, close the database (SIGTERM: nothing is lost)."""
        self.wait_idle(30.0)
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=30.0)
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()

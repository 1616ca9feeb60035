"""Durable aggregator state: what must survive a restart, in SQLite (WAL) under the state directory.

An acked Xid or pending row remap is never resent, so without this store a faulty GPU would look healthy
after a restart. Anything that must survive registers as a :class:`StateHolder` (``snapshot(full)`` of its
changed typed records, ``restore``); the store never looks inside a record. Writes are behind with group
commit: changes are collected on the event loop and committed by one writer thread; the ack path
(:mod:`sentinel.aggregator.acks`) acks a batch only once its changes are committed, and a failed commit is
kept and retried with backoff (counted, logged, alerted), never dropped. See docs/aggregator.md.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, Protocol

import msgspec

from sentinel.log import get_logger

SCHEMA_VERSION = 1


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

    #: a warm start, not a fact an ack promises: left out of the ack path's flushes (``facts_only``)
    warm_start = True

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
    """The state database cannot be used (one line naming the file and the problem): the aggregator does not
    start, since every ack it sent would then promise a durability it does not have."""


class StoreSchemaError(StoreError):
    """The file is not a sentinel state database, or one of a schema this sentinel does not read."""


#: one holder's part of a flush: its name, whether it is a full snapshot (replaces every record), changes
Write = tuple[str, bool, dict[str, bytes | None]]

#: what opens the database (injected by tests that need SQLite itself to run out of room)
Connect = Callable[[Path], sqlite3.Connection]

#: write a record, replacing the key's earlier value (an upsert where SQLite has them, 3.24 on)
_UPSERT = (
    "INSERT INTO records VALUES (?,?,?) ON CONFLICT (holder, key) DO UPDATE SET value = excluded.value"
    if sqlite3.sqlite_version_info >= (3, 24, 0)
    else "INSERT OR REPLACE INTO records VALUES (?,?,?)"
)
#: the columns of each table this sentinel reads, in order
TABLES = {"meta": ("name", "value"), "records": ("holder", "key", "value")}
#: a failed commit is retried after this long, doubling up to RETRY_MAX_S (every attempt counted and alerted)
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 5.0
#: while commits keep failing, one log line at the first failure and then at most one per this interval
FAILING_LOG_EVERY_S = 60.0


def sqlite_connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=10, check_same_thread=False, isolation_level=None)


def check_schema(db: sqlite3.Connection, path: Path) -> None:
    """Raise :class:`StoreSchemaError` unless ``db`` is empty or holds this sentinel's tables and version."""
    try:
        tables = {str(name) for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise StoreSchemaError(f"{path}: not an SQLite database ({exc})") from None
    if not tables:
        return
    for table, columns in TABLES.items():
        found = tuple(str(row[1]) for row in db.execute(f"PRAGMA table_info({table})"))
        if table in tables and found != columns:
            raise StoreSchemaError(
                f"{path}: table {table!r} has columns ({', '.join(found)[:200]}), "
                f"this sentinel reads ({', '.join(columns)}): not a sentinel state database"
            )
    missing = [table for table in TABLES if table not in tables]
    if missing:
        raise StoreSchemaError(
            f"{path}: not a sentinel state database (tables {', '.join(sorted(tables))[:200]}; "
            f"no {', '.join(repr(t) for t in missing)})"
        )
    row = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
    if row is None:
        raise StoreSchemaError(f"{path}: no schema version in table 'meta': not a sentinel state database")
    if str(row[0]) != str(SCHEMA_VERSION):
        raise StoreSchemaError(f"{path}: schema version {row[0]}, this sentinel reads {SCHEMA_VERSION}")


def merge_writes(older: dict[str, tuple[bool, dict[str, bytes | None]]], newer: list[Write]) -> None:
    """Fold ``newer`` into ``older`` (by holder, in place): a later value of a key replaces the earlier one, a
    full snapshot replaces everything before it. What is pending is thus one record per key at most."""
    for name, replace, changes in newer:
        before = older.get(name)
        if replace or before is None:
            older[name] = (replace, dict(changes))
        else:
            before[1].update(changes)


class StateStore:
    """One SQLite database ``state.sqlite3``: ``records(holder, key, value)`` plus a schema version.

    Every :meth:`flush` is a *generation*; :attr:`committed` is the latest generation whose changes (and all
    before it) are on disk, and ``on_commit(generation)`` is called (from the writer thread) when it moves.
    Changes handed to the writer are kept until they are committed: a commit that fails (a full disk, a
    read-only file system, an I/O error) is retried with backoff, with whatever was flushed meanwhile folded
    in, one record per key, so nothing is dropped and memory stays bounded by the state itself.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        flush_interval_s: float = 0.5,
        connect: Connect = sqlite_connect,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.path = state_dir / "state.sqlite3"
        self.flush_interval_s = flush_interval_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.holders: list[StateHolder] = []
        self.flushes = 0
        self.records_written = 0
        self.write_errors = 0
        #: failed commit attempts (each retried): ``sentinel_aggregator_state_commit_failures_total``
        self.commit_failures = 0
        self.last_flush_seconds = 0.0
        self.last_commit_at = 0.0
        #: the latest generation issued by :meth:`flush`, and the latest one on disk
        self.generation = 0
        self.committed = 0
        self.on_commit: Callable[[int], None] | None = None
        self._next_flush = 0.0
        self._lock = threading.Condition()
        self._pending: dict[str, tuple[bool, dict[str, bytes | None]]] = {}
        self._pending_generation = 0
        self._pending_since: float | None = None  # monotonic time of the oldest change not handed over
        self._inflight: dict[str, tuple[bool, dict[str, bytes | None]]] | None = None
        self._inflight_since: float | None = None
        self._stopping = False
        self._abandoned = False
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._db = self._open(connect)
        except StoreSchemaError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open the state database: {exc}") from None
        self._writer = threading.Thread(target=self._write_loop, name="state-store-writer", daemon=True)
        self._writer.start()

    def _open(self, connect: Connect) -> sqlite3.Connection:
        db = connect(self.path)
        try:
            check_schema(db, self.path)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute(
                "CREATE TABLE IF NOT EXISTS records ("
                "holder TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (holder, key))"
            )
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        except BaseException:
            db.close()
            raise
        return db

    # -- registration and restore ---------------------------------------------------------------------

    def register(self, holder: StateHolder, now: float) -> int:
        """Add ``holder`` and hand it what the database has for it; returns how many records it got.

        A holder whose records cannot be decoded logs the error and starts empty: a damaged record must not
        keep the aggregator from running (the agents' fresh data rebuilds most of it).
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

    def flush(self, monotonic: float | None = None, *, full: bool = False, facts_only: bool = False) -> int:
        """Collect the holders' changes for the writer thread as generation :attr:`generation` + 1; returns
        the records collected.

        ``facts_only`` (the ack path's group commit) leaves out warm-start holders (``warm_start``: detector
        memory, written on the detector loop's own schedule) and does not move the periodic schedule.
        """
        started = time.perf_counter()
        if not facts_only:
            self._next_flush = (
                monotonic if monotonic is not None else time.monotonic()
            ) + self.flush_interval_s
        writes: list[Write] = []
        count = 0
        for holder in self.holders:
            if facts_only and getattr(holder, "warm_start", False):
                continue
            try:
                changes = holder.snapshot(full)
            except Exception as exc:  # one holder's bug must not stop the others from persisting
                self.write_errors += 1
                log().error("state_snapshot_failed", holder=holder.state_name, error=str(exc)[:300])
                continue
            if changes or full:
                writes.append((holder.state_name, full, changes))
                count += len(changes)
        self.generation += 1
        generation = self.generation
        with self._lock:
            merge_writes(self._pending, writes)
            self._pending_generation = generation
            idle = not self._pending and self._inflight is None
            if idle:  # nothing to write, nothing being written: everything up to here is on disk
                self.committed = generation
            else:
                if self._pending_since is None:
                    self._pending_since = time.monotonic()
                self._lock.notify_all()
        if idle:
            self._committed(generation)
        self.flushes += 1
        self.last_flush_seconds = time.perf_counter() - started
        return count

    @property
    def uncommitted_records(self) -> int:
        """Records flushed and not yet on disk (pending or being written; a key in both counts once)."""
        with self._lock:
            parts = [self._pending] + ([self._inflight] if self._inflight is not None else [])
            return len(
                {(name, key) for part in parts for name, (_, changes) in part.items() for key in changes}
            )

    def commit_lag(self, monotonic: float | None = None) -> float:
        """Seconds since the oldest change flushed and not yet on disk was flushed (0: all on disk)."""
        with self._lock:
            since = [t for t in (self._inflight_since, self._pending_since) if t is not None]
        if not since:
            return 0.0
        return max(0.0, (monotonic if monotonic is not None else time.monotonic()) - min(since))

    def _committed(self, generation: int) -> None:
        callback = self.on_commit
        if callback is not None:
            try:
                callback(generation)
            except Exception as exc:  # the ack path's bug must not stop the writer
                log().error("state_commit_callback_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    def _write_loop(self) -> None:
        delay = self.retry_initial_s
        failing_since: float | None = None
        attempts = 0
        next_log = 0.0
        while True:
            with self._lock:
                while not self._stopping and not self._pending and self._pending_generation <= self.committed:
                    self._lock.wait()
                if self._abandoned or (
                    self._stopping and not self._pending and self._pending_generation <= self.committed
                ):
                    return
                writes, self._pending = self._pending, {}
                generation = self._pending_generation
                self._inflight, self._inflight_since = writes, self._pending_since
                self._pending_since = None
            try:
                if writes:
                    self._commit([(name, replace, changes) for name, (replace, changes) in writes.items()])
                error = None
            except (sqlite3.Error, OSError) as exc:
                error = exc
            with self._lock:
                if error is None:
                    self.committed = max(self.committed, generation)
                else:  # kept: folded under whatever was flushed meanwhile, retried after the backoff
                    newer, self._pending = self._pending, writes
                    merge_writes(self._pending, [(n, r, c) for n, (r, c) in newer.items()])
                    self._pending_since = self._inflight_since
                self._inflight = self._inflight_since = None
                self._lock.notify_all()
            now = time.monotonic()
            if error is None:
                if failing_since is not None:
                    log().warning(
                        "state_write_recovered",
                        path=str(self.path),
                        attempts=attempts,
                        failing_s=round(now - failing_since, 3),
                    )
                failing_since, attempts, delay = None, 0, self.retry_initial_s
                self._committed(generation)
                continue
            self.write_errors += 1
            self.commit_failures += 1
            attempts += 1
            if failing_since is None or now >= next_log:
                log().error(
                    "state_write_failed" if failing_since is None else "state_write_still_failing",
                    path=str(self.path),
                    error=str(error)[:300],
                    attempts=attempts,
                    records_kept=self.uncommitted_records,
                    retry_in_s=round(delay, 3),
                )
                next_log = now + FAILING_LOG_EVERY_S
            if failing_since is None:
                failing_since = now
            with self._lock:  # the backoff: new flushes do not cut it short, a final close waits it out
                deadline = time.monotonic() + delay
                while not self._abandoned and (left := deadline - time.monotonic()) > 0:
                    self._lock.wait(left)
            delay = min(delay * 2, self.retry_max_s)

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
                if kept:  # (an upsert: REPLACE would delete and re-insert every changed row)
                    db.executemany(_UPSERT, kept)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self.records_written += sum(len(changes) for _, _, changes in writes)
        self.last_commit_at = time.time()

    def wait_committed(self, generation: int | None = None, timeout_s: float = 10.0) -> bool:
        """Block until ``generation`` (default: the latest flushed) is on disk; False on timeout."""
        target = self.generation if generation is None else generation
        with self._lock:
            return self._lock.wait_for(lambda: self.committed >= target, timeout_s)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until everything flushed is committed (tests, shutdown)."""
        return self.wait_committed(None, timeout_s)

    def close(self, timeout_s: float = 30.0) -> bool:
        """Flush everything and wait (retrying, within ``timeout_s``) until it is on disk, then close.

        SIGTERM loses nothing the disk takes within ``timeout_s``; what it still refuses then is logged
        (``state_not_written``): those batches were not acked, so the agents resend them to the next process.
        Returns whether everything was written.
        """
        self.flush()
        written = self.wait_committed(self.generation, timeout_s)
        if not written:
            self.write_errors += 1
            log().error(
                "state_not_written",
                path=str(self.path),
                records=self.uncommitted_records,
                waited_s=timeout_s,
                detail="the disk refused every retry; unacked batches are resent by the agents",
            )
        with self._lock:
            self._stopping = True
            self._abandoned = not written
            self._lock.notify_all()
        self._writer.join(timeout=timeout_s)
        if not self._writer.is_alive():
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._db.close()
        return written

    def abandon(self) -> None:
        """What ``kill -9`` leaves (tests): the writer stops, nothing more is written, the database as last
        committed."""
        with self._lock:
            self._stopping = self._abandoned = True
            self._lock.notify_all()
        self._writer.join(timeout=30.0)
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

"""Batches on disk until the aggregator acks them, and sequence numbers that survive restarts.

Every batch is spooled as it is made and deleted once every consumer (each configured aggregator) has
acked it, so a crash or an aggregator outage loses nothing within the byte bound; beyond it, samples go
before events, and what was dropped is reported in the next batch's ``drops``. Per-consumer ack logs keep
an agent restart from resending what was acked, and sequence numbers are reserved in persisted blocks so
they stay monotonic per host for the aggregator's (host, seq) deduplication. The numbering is named by an instance id made with the
state directory (sent in the Hello), so a wiped state directory starts the host's dedup window over.
See docs/agent.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path

import msgspec

from sentinel.log import get_logger
from sentinel.wire import Batch, Drops, encode

SEQ_BLOCK = 1000
#: an ack log larger than this is not read at start (the spool's own bound keeps real ones far smaller)
MAX_ACK_LOG_BYTES = 64 * 1024 * 1024
#: an ack log is compacted once it holds this many lines more than twice its live acks
ACK_LOG_SLACK = 1024

log = get_logger(module="agent.spool")
_batch_decoder = msgspec.msgpack.Decoder(Batch)


@dataclass
class _Entry:
    seq: int
    size: int
    samples: int
    events: int
    path: Path


class SeqAllocator:
    """Per-host batch sequence numbers, monotonic across restarts."""

    def __init__(self, path: Path | None, floor: int = 0) -> None:
        """``path`` None: numbers are kept in memory only (a simulated or stream-less agent)."""
        self._path = path
        reserved = 0
        try:
            reserved = int(path.read_text().strip() or "0") if path is not None else 0
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("seq_state_unreadable", path=str(path), error=str(exc))
        self._next = max(reserved, floor)
        self._reserved = self._next
        self.persist_errors = 0

    @property
    def next(self) -> int:
        return self._next

    def allocate(self) -> int:
        if self._next >= self._reserved:
            self._reserve(self._next + SEQ_BLOCK)
        seq = self._next
        self._next += 1
        return seq

    def _reserve(self, upto: int) -> None:
        if self._path is None:
            self._reserved = upto
            return
        tmp = self._path.with_suffix(".tmp")
        try:
            tmp.write_text(f"{upto}\n")
            os.replace(tmp, self._path)
        except OSError as exc:
            self.persist_errors += 1
            log.warning("seq_state_write_failed", path=str(self._path), error=str(exc))
        self._reserved = upto


def stream_instance(path: Path | None) -> str:
    """The id of this agent's seq numbering: read from ``path``, or made (random) and written there.

    ``path`` None (numbers kept in memory only): a new id per process, as its numbering restarts with it.
    An id that cannot be written is used for this process and logged: the next start makes another, which
    only makes the aggregator start the host's dedup window over at that start's first seq.
    """
    if path is not None:
        try:
            text = path.read_text(encoding="ascii").strip()
            if 8 <= len(text) <= 64 and text.isalnum():
                return text
            log.warning("instance_id_unreadable", path=str(path), problem="not an instance id")
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("instance_id_unreadable", path=str(path), error=str(exc))
    made = secrets.token_hex(16)
    if path is not None:
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(f"{made}\n", encoding="ascii")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("instance_id_write_failed", path=str(path), error=str(exc))
    return made


class Spool:
    """Unacked batches on disk, bounded in bytes, in seq order."""

    def __init__(self, directory: Path, max_bytes: int, consumers: tuple[str, ...] = ()) -> None:
        """``consumers``: one name per aggregator when there are several (empty or one: plain acks)."""
        self.directory = directory
        self.max_bytes = max_bytes
        self.consumers = consumers if len(consumers) > 1 else ()
        #: per consumer, the spooled seqs it has acked while another consumer has not yet
        self._acked: dict[str, set[int]] = {name: set() for name in self.consumers}
        self._ack_logs = {name: AckLog(directory, name) for name in self.consumers}
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._with_samples: deque[int] = deque()
        self._bytes = 0
        self.dropped_samples = 0
        self.dropped_events = 0
        self._taken = Drops()  # the totals as :meth:`take_drops` last reported them
        self.write_errors = 0
        #: the newest batch's seq and bytes, as written: the shipper sends it next, without reading it back
        self._newest: tuple[int, bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self._load()

    # -- index ----------------------------------------------------------------------------------------------

    def _load(self) -> None:
        found: list[_Entry] = []
        for path in self.directory.glob("*.batch"):
            parts = path.stem.split("_")
            try:
                seq, samples, events = (int(p) for p in parts)
                size = path.stat().st_size
            except (ValueError, OSError):
                log.warning("spool_file_ignored", path=str(path), problem="unexpected name")
                continue
            found.append(_Entry(seq, size, samples, events, path))
        for entry in sorted(found, key=lambda e: e.seq):
            self._index(entry)
        self._load_acks()
        if found:
            log.info("spool_loaded", batches=len(self._entries), bytes=self._bytes)

    def _load_acks(self) -> None:
        """Each consumer's acks from its log; batches every consumer had acked go; stale logs are removed."""
        kept = {ack_log.path for ack_log in self._ack_logs.values()}
        for path in self.directory.glob("acks-*.log"):
            if path not in kept:  # an aggregator no longer configured (or a single one now)
                with contextlib.suppress(OSError):
                    path.unlink()
        for name, ack_log in self._ack_logs.items():
            self._acked[name] = {seq for seq in ack_log.load() if seq in self._entries}
        if self._acked:
            done = set.intersection(*self._acked.values())
            for seq in sorted(done):
                self._forget(seq, unlink=True)
        for name, ack_log in self._ack_logs.items():
            ack_log.rewrite(self._acked[name])

    def _index(self, entry: _Entry) -> None:
        self._entries[entry.seq] = entry
        self._bytes += entry.size
        if entry.samples:
            self._with_samples.append(entry.seq)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def max_seq(self) -> int:
        return next(reversed(self._entries)) if self._entries else -1

    def seqs(self, consumer: str | None = None) -> list[int]:
        """Spooled batch numbers not yet acked (by ``consumer``, when given), oldest first."""
        acked = self._acked.get(consumer) if consumer is not None else None
        if not acked:
            return list(self._entries)
        return [s for s in self._entries if s not in acked]

    def seqs_after(self, seq: int, consumer: str | None = None) -> list[int]:
        acked = self._acked.get(consumer) if consumer is not None else None
        if not acked:
            return [s for s in self._entries if s > seq]
        return [s for s in self._entries if s > seq and s not in acked]

    # -- writing --------------------------------------------------------------------------------------------

    def _path(self, seq: int, samples: int, events: int) -> Path:
        return self.directory / f"{seq:020d}_{samples}_{events}.batch"

    def add(self, batch: Batch, data: bytes | None = None) -> None:
        """Spool a new batch (its seq above every spooled one; ``data``: its encoding if already made)."""
        samples = len(batch.samples) + len(batch.heads)
        data = encode(batch) if data is None else data
        path = self._path(batch.seq, samples, len(batch.events))
        try:
            _write_file(path, data)
        except OSError as exc:
            self.write_errors += 1
            log.warning("spool_write_failed", path=str(path), error=str(exc))
            return
        self._index(_Entry(batch.seq, len(data), samples, len(batch.events), path))
        self._newest = (batch.seq, data)
        self._enforce()

    def read(self, seq: int) -> bytes | None:
        entry = self._entries.get(seq)
        if entry is None:
            return None
        newest = self._newest
        if newest is not None and newest[0] == seq:
            return newest[1]
        try:
            return entry.path.read_bytes()
        except OSError as exc:
            log.warning("spool_read_failed", path=str(entry.path), error=str(exc))
            self._forget(seq, unlink=False)
            return None

    def ack(self, seq: int, consumer: str | None = None) -> bool:
        """The aggregator (``consumer``) has the batch; forgotten once every consumer has it.

        False if it was not (or no longer) spooled, or this consumer had acked it already.
        """
        if seq not in self._entries:
            return False
        acked = self._acked.get(consumer) if consumer is not None else None
        if acked is not None and consumer is not None:
            if seq in acked:
                return False
            acked.add(seq)
            if not all(seq in others for others in self._acked.values()):
                self._log_ack(consumer, seq)
                return True
        self._forget(seq, unlink=True)
        return True

    def _log_ack(self, consumer: str, seq: int) -> None:
        ack_log = self._ack_logs[consumer]
        if not ack_log.append(seq):
            self.write_errors += 1
        live = self._acked[consumer]
        if ack_log.lines > 2 * len(live) + ACK_LOG_SLACK and not ack_log.rewrite(live):
            self.write_errors += 1

    def _forget(self, seq: int, *, unlink: bool) -> _Entry:
        entry = self._entries.pop(seq)
        if self._newest is not None and self._newest[0] == seq:
            self._newest = None
        for acked in self._acked.values():
            acked.discard(seq)
        self._bytes -= entry.size
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()
        return entry

    def _enforce(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            if self._with_samples:
                self._strip_samples(self._with_samples.popleft())
                continue
            oldest = next(iter(self._entries))
            entry = self._forget(oldest, unlink=True)
            self.dropped_events += entry.events

    def _strip_samples(self, seq: int) -> None:
        entry = self._entries.get(seq)
        if entry is None or not entry.samples:
            return
        try:
            batch = _batch_decoder.decode(entry.path.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("spool_file_unreadable", path=str(entry.path), error=str(exc))
            self._forget(seq, unlink=True)
            self.dropped_samples += entry.samples
            return
        stripped = msgspec.structs.replace(batch, samples=[], heads=[])
        data = encode(stripped)
        path = self._path(seq, 0, entry.events)
        if self._newest is not None and self._newest[0] == seq:
            self._newest = None
        try:
            _write_file(path, data)
            entry.path.unlink()
        except OSError as exc:
            self.write_errors += 1
            log.warning("spool_write_failed", path=str(path), error=str(exc))
            return
        self._bytes += len(data) - entry.size
        self.dropped_samples += entry.samples
        self._entries[seq] = _Entry(seq, len(data), 0, entry.events, path)

    def take_drops(self) -> Drops:
        """Drops since the last call: the change in :attr:`dropped_samples` and :attr:`dropped_events`."""
        last, self._taken = self._taken, Drops(samples=self.dropped_samples, events=self.dropped_events)
        return Drops(samples=self._taken.samples - last.samples, events=self._taken.events - last.events)


def _write_file(path: Path, data: bytes) -> None:
    """``path`` created (or truncated) holding ``data``: what ``Path.write_bytes`` does, without its buffered
    file object's extra system calls (a batch is written every tick)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class AckLog:
    """One consumer's acks of batches still spooled, on disk: the URL, then one seq per line, appended."""

    def __init__(self, directory: Path, consumer: str) -> None:
        digest = hashlib.sha256(consumer.encode()).hexdigest()[:16]
        self.path = directory / f"acks-{digest}.log"
        self.consumer = consumer
        self.lines = 0  # seq lines in the file (live or not), to know when to compact

    def load(self) -> set[int]:
        """The seqs acked, from the file; a torn or foreign line is skipped, a foreign file ignored."""
        try:
            if self.path.stat().st_size > MAX_ACK_LOG_BYTES:
                log.warning("spool_ack_log_ignored", path=str(self.path), problem="too large")
                return set()
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return set()
        except OSError as exc:
            log.warning("spool_ack_log_unreadable", path=str(self.path), error=str(exc))
            return set()
        header, _, body = text.partition("\n")
        if header != self.consumer:
            log.warning("spool_ack_log_ignored", path=str(self.path), problem="written for another URL")
            return set()
        acked: set[int] = set()
        for line in body.split("\n")[:-1]:  # the last piece has no newline: torn (or empty)
            if line.isdigit() and len(line) <= 20:
                acked.add(int(line))
        return acked

    def append(self, seq: int) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size == 0:
                    os.write(fd, f"{self.consumer}\n".encode())
                os.write(fd, f"{seq}\n".encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("spool_ack_log_write_failed", path=str(self.path), error=str(exc))
            return False
        self.lines += 1
        return True

    def rewrite(self, acked: set[int]) -> bool:
        """Replace the file by exactly ``acked`` (atomically: a crash leaves the old or the new one)."""
        tmp = self.path.with_suffix(".tmp")
        body = "".join(f"{seq}\n" for seq in sorted(acked))
        try:
            tmp.write_text(f"{self.consumer}\n{body}", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("spool_ack_log_write_failed", path=str(self.path), error=str(exc))
            return False
        self.lines = len(acked)
        return True

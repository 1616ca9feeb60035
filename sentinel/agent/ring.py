"""The host's share of the distributed flight recorder: the last N minutes of what the agent saw.

Appending must be cheap (it happens every tick for every GPU), so entries are stored as the msgpack bytes
the agent already produced, with byte accounting; decoding to JSON only happens on the rare snapshot. GPU
samples, the bulk of it (one per GPU per second for ``window_s``), are kept deflated against a dictionary of
their field names, several ticks' samples as one block: a deflate stream costs about as much to start as to
fill with a few samples, and the GPUs of one tick and of the ticks after it repeat each other. The newest
samples wait as msgpack until they make a block of :data:`GROUP_BYTES` (an eighth of the byte bound at most).
The buffer is bounded twice: by age (``window_s``) and by total bytes stored (oldest entries go first).

A snapshot is a :class:`sentinel.wire.Snapshot` (what ``sentinel agent snapshot`` prints as JSON and the
aggregator merges across hosts)::

    {"command": "snapshot", "host": str, "window": [t0, t1],
     "entries": [{"t": float, "type": "sample" | "event" | "heads" | "procs", "data": {...}}, ...]}

``entries`` are time-ordered typed entries; ``window`` is the time span the buffer covers (t0 = oldest entry
kept, or the requested ``since``; t1 = the snapshot time).
"""

from __future__ import annotations

import bisect
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec
import msgspec.inspect

from sentinel.fr.heads import FrHeads
from sentinel.wire import (
    Event,
    EventEntry,
    GpuSample,
    HeadsEntry,
    ProcsEntry,
    ProcsMap,
    RingEntry,
    SampleEntry,
    Snapshot,
)

EntryType = Literal["sample", "event", "heads", "procs"]

#: per-entry bookkeeping beyond the payload (tuple, float, str reference), for the byte bound
ENTRY_OVERHEAD = 96

_encoder = msgspec.msgpack.Encoder()
_samples = msgspec.msgpack.Decoder(list[GpuSample])
_events = msgspec.msgpack.Decoder(Event)
_heads = msgspec.msgpack.Decoder(FrHeads)
_procs = msgspec.msgpack.Decoder(ProcsMap)


def _field_names(root: type[msgspec.Struct]) -> bytes:
    """The msgpack of every field name of ``root`` and the structs inside it: what every sample repeats."""
    names: list[str] = []
    pending: list[msgspec.inspect.Type] = [msgspec.inspect.type_info(root)]
    seen: set[type] = set()
    while pending:
        info = pending.pop()
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls in seen:
                continue
            seen.add(info.cls)
            names.extend(f.encode_name for f in info.fields)
            pending.extend(f.type for f in info.fields)
        for attr in ("item_type", "key_type", "value_type", "types", "item_types"):
            inner = getattr(info, attr, None)
            if isinstance(inner, tuple):
                pending.extend(inner)
            elif inner is not None:
                pending.append(inner)
    return b"".join(_encoder.encode(name) for name in names)


_SAMPLE_DICT = _field_names(GpuSample)


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(1, zdict=_SAMPLE_DICT)
    return packer.compress(data) + packer.flush()


def _inflate(data: bytes) -> bytes:
    return zlib.decompressobj(zdict=_SAMPLE_DICT).decompress(data)


def _array_header(n: int) -> bytes:
    """The msgpack array header of ``n`` items: with it, the samples' concatenated msgpack is one list."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


#: one stored entry: (time, type, bytes, the time of each sample of a sample block else None, the order it
#: came in: one number, or each sample's for a block)
Stored = tuple[float, EntryType, bytes, tuple[float, ...] | None, int | tuple[int, ...]]

#: the newest samples' msgpack (with their per-entry overhead) makes a deflated block at this size
GROUP_BYTES = 64 * 1024


class RingBuffer:
    """Time-ordered entries of (t, type, msgpack bytes), bounded by age and bytes; GPU samples in blocks."""

    def __init__(self, host: str, window_s: float, max_bytes: int) -> None:
        self.host = host
        self.window_s = window_s
        self.max_bytes = max_bytes
        self._entries: deque[Stored] = deque()
        self._bytes = 0
        self._count = 0
        self._order = 0
        self.evicted = 0
        #: samples not in a block yet: their msgpack, times and arrival order, and bytes counted for them
        self._group_at = min(GROUP_BYTES, max_bytes // 8)
        self._pending: list[bytes] = []
        self._pending_times: list[float] = []
        self._pending_order: list[int] = []
        self._pending_bytes = 0

    def __len__(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def append(self, t: float, kind: EntryType, payload: msgspec.Struct | bytes) -> None:
        """Add one entry (a Struct is encoded here; already-encoded bytes are stored as they are).

        Entries normally arrive in time order; an out-of-order one is inserted at its place so snapshots
        stay sorted.
        """
        data = payload if isinstance(payload, bytes) else _encoder.encode(payload)
        if kind == "sample":
            self._add_samples([t], [data])
        else:
            self._insert((t, kind, data, None, self._next_order()))
        self._evict(t)

    def extend(self, kind: EntryType, items: Iterable[tuple[float, msgspec.Struct]]) -> list[bytes]:
        """Add one tick's entries of one type at once (what :meth:`append` does for each, one eviction pass:
        the agent adds every sample of every tick, so the per-entry cost matters).

        Returns each entry's msgpack, in order: the agent splices these same bytes into the tick's frame
        (:func:`sentinel.agent.batch.fit_frame`) rather than encoding every sample twice.
        """
        encode = _encoder.encode
        times: list[float] = []
        encoded: list[bytes] = []
        for t, payload in items:
            times.append(t)
            encoded.append(encode(payload))
        if not encoded:
            return []
        if kind == "sample":
            self._add_samples(times, encoded)
        else:
            for t, data in zip(times, encoded, strict=True):
                self._insert((t, kind, data, None, self._next_order()))
        self._evict(max(times))
        return encoded

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _add_samples(self, times: list[float], encoded: list[bytes]) -> None:
        """One tick's samples into the pending group (one arrival number for them all); a full group
        becomes a block."""
        n = len(encoded)
        size = sum(map(len, encoded)) + ENTRY_OVERHEAD * n
        self._pending.extend(encoded)
        self._pending_times.extend(times)
        self._pending_order.extend([self._next_order()] * n)
        self._pending_bytes += size
        self._bytes += size
        self._count += n
        if self._pending_bytes >= self._group_at:
            self._seal()

    def _seal(self) -> None:
        """The pending samples as one deflated block, placed at its newest sample's time."""
        pending = self._pending
        if not pending:
            return
        times = tuple(self._pending_times)
        block = _deflate(_array_header(len(pending)) + b"".join(pending))
        self._bytes -= self._pending_bytes
        self._count -= len(pending)
        self._insert((max(times), "sample", block, times, tuple(self._pending_order)))
        self._pending = []
        self._pending_times = []
        self._pending_order = []
        self._pending_bytes = 0

    def _insert(self, entry: Stored) -> None:
        """One entry at its place in time (normally the end: an out-of-order one goes where it belongs, so
        snapshots stay sorted)."""
        entries = self._entries
        t = entry[0]
        if not entries or entries[-1][0] <= t:
            entries.append(entry)
        else:
            entries.insert(bisect.bisect_right([e[0] for e in entries], t), entry)
        self._bytes += len(entry[2]) + ENTRY_OVERHEAD * (len(entry[3]) if entry[3] else 1)
        self._count += len(entry[3]) if entry[3] else 1

    def _evict(self, now: float) -> None:
        horizon = now - self.window_s
        entries = self._entries
        while entries and (self._bytes > self.max_bytes or entries[0][0] < horizon):
            _, _, data, times, _ = entries.popleft()
            count = len(times) if times else 1
            self._bytes -= len(data) + ENTRY_OVERHEAD * count
            self._count -= count
            self.evicted += count

    def snapshot(self, now: float, since: float | None = None) -> Snapshot:
        """The snapshot (see the module docstring), entries with ``t >= since``."""
        self._evict(now)
        oldest = max(since, now - self.window_s) if since is not None else now - self.window_s
        keyed: list[tuple[float, int, RingEntry]] = []
        for t, kind, data, times, order in self._entries:
            if times is not None:
                assert isinstance(order, tuple)
                _keep_samples(keyed, times, order, _samples.decode(_inflate(data)), oldest)
            elif t >= oldest:
                assert isinstance(order, int)
                keyed.append((t, order, _entry(t, kind, data)))
        if self._pending:
            raw = _array_header(len(self._pending)) + b"".join(self._pending)
            _keep_samples(keyed, self._pending_times, self._pending_order, _samples.decode(raw), oldest)
        keyed.sort(key=lambda k: (k[0], k[1]))  # by time, then in the order they came
        entries = [entry for _, _, entry in keyed]
        start = since if since is not None else (entries[0].t if entries else now)
        return Snapshot(host=self.host, window=(start, now), entries=entries)


def _keep_samples(
    keyed: list[tuple[float, int, RingEntry]],
    times: Sequence[float],
    order: Sequence[int],
    samples: list[GpuSample],
    oldest: float,
) -> None:
    keyed.extend(
        (ts, n, SampleEntry(t=ts, data=sample))
        for ts, n, sample in zip(times, order, samples, strict=True)
        if ts >= oldest
    )


def _entry(t: float, kind: EntryType, data: bytes) -> RingEntry:
    """One stored entry other than samples, decoded back to the type it was appended as (the agent's own
    bytes)."""
    if kind == "event":
        return EventEntry(t=t, data=_events.decode(data))
    if kind == "heads":
        return HeadsEntry(t=t, data=_heads.decode(data))
    return ProcsEntry(t=t, data=_procs.decode(data))

"""The host's share of the distributed flight recorder: the last N minutes of what the agent saw.

Appending must be cheap (it happens every tick for every GPU), so entries are stored as the msgpack bytes
the agent already produced, with byte accounting; decoding to JSON only happens on the rare snapshot. GPU
samples, the bulk of it (one per GPU per second for ``window_s``), are kept deflated against a dictionary of
their field names, each tick's samples as one block: a deflate stream costs about as much to start as to
fill with a few samples, and the GPUs of one tick repeat each other. The buffer is bounded twice: by age
(``window_s``) and by total bytes stored (oldest entries go first).

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
from collections.abc import Iterable
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


#: one stored entry: (time, type, bytes, the time of each sample of a sample block, else None)
Stored = tuple[float, EntryType, bytes, tuple[float, ...] | None]


class RingBuffer:
    """Time-ordered entries of (t, type, msgpack bytes), bounded by age and bytes; GPU samples in blocks."""

    def __init__(self, host: str, window_s: float, max_bytes: int) -> None:
        self.host = host
        self.window_s = window_s
        self.max_bytes = max_bytes
        self._entries: deque[Stored] = deque()
        self._bytes = 0
        self._count = 0
        self.evicted = 0

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
            self._insert((t, kind, _deflate(_array_header(1) + data), (t,)))
        else:
            self._insert((t, kind, data, None))
        self._evict(t)

    def extend(self, kind: EntryType, items: Iterable[tuple[float, msgspec.Struct]]) -> list[bytes]:
        """Add one tick's entries of one type at once (what :meth:`append` does for each, one eviction pass:
        the agent adds every sample of every tick, so the per-entry cost matters).

        Returns each entry's msgpack, in order: the agent splices these same bytes into the tick's frame
        (:func:`sentinel.agent.batch.fit_frame`) rather than encoding every sample twice.
        """
        encode = _encoder.encode
        pairs = [(t, encode(payload)) for t, payload in items]
        if not pairs:
            return []
        encoded = [data for _, data in pairs]
        if kind == "sample":
            times = tuple(t for t, _ in pairs)
            block = _deflate(_array_header(len(encoded)) + b"".join(encoded))
            self._insert((max(times), kind, block, times))
        else:
            for t, data in pairs:
                self._insert((t, kind, data, None))
        self._evict(max(t for t, _ in pairs))
        return encoded

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
            _, _, data, times = entries.popleft()
            count = len(times) if times else 1
            self._bytes -= len(data) + ENTRY_OVERHEAD * count
            self._count -= count
            self.evicted += count

    def snapshot(self, now: float, since: float | None = None) -> Snapshot:
        """The snapshot (see the module docstring), entries with ``t >= since``."""
        self._evict(now)
        oldest = max(since, now - self.window_s) if since is not None else now - self.window_s
        entries: list[RingEntry] = []
        for t, kind, data, times in self._entries:
            if times is not None:
                entries.extend(
                    SampleEntry(t=ts, data=sample)
                    for ts, sample in zip(times, _samples.decode(_inflate(data)), strict=True)
                    if ts >= oldest
                )
            elif t >= oldest:
                entries.append(_entry(t, kind, data))
        entries.sort(key=lambda e: e.t)  # a block sits at its newest sample's time: the others go before it
        start = since if since is not None else (entries[0].t if entries else now)
        return Snapshot(host=self.host, window=(start, now), entries=entries)


def _entry(t: float, kind: EntryType, data: bytes) -> RingEntry:
    """One stored entry other than samples, decoded back to the type it was appended as (the agent's own
    bytes)."""
    if kind == "event":
        return EventEntry(t=t, data=_events.decode(data))
    if kind == "heads":
        return HeadsEntry(t=t, data=_heads.decode(data))
    return ProcsEntry(t=t, data=_procs.decode(data))

"""Decode only the recent part of a pickle dump: the header, a few first entries, the newest ones.

The analysis reads ``pg_status`` and the newest entries, so decoding whole ring buffers of thousands of
ranks would be wasted work. In PyTorch's pickles every entry starts with the same memoized key, so entry
starts can be found in the bytes: the header and first entries (which define the memo) are decoded, then
the newest ``keep`` entries. Any doubt returns None and the caller decodes the whole file. Whether a
skipped entry is still pending is answered by a bytes search of the middle (:func:`_skipped_done`), with
coalesced batch members checked against their closing entries (:class:`_Batches`). Protocols 2 to 5 are
read so (frames removed, MEMOIZE's implied indices counted: :func:`_memo_kept`); JSON dumps in
:mod:`sentinel.fr.recent_json`. docs/flight-recorder.md ("Speed") describes the rules.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import pickle
import re
from collections.abc import Callable, Iterator

from sentinel.fr.ops import COALESCED, P2P, closes_p2p_batch, entry_completed, op_name, p2p_peer
from sentinel.fr.records import TYPE_CHECKING
from sentinel.fr.safepickle import plain_unpickler

if TYPE_CHECKING:
    from typing import Any

#: Entries decoded from the start of a buffer that wrapped: they define the memo (keys, op names, stack
#: frames) that later entries refer to. The oldest entries of a wrapped buffer are the training loop's, whose
#: code paths the newest entries repeat: the real wrapped dumps of ``tests/data`` need 3 (each entry decoded
#: here costs about twice a later one, for the strings it memoizes). When the
#: newest entries refer to something pickled later, 4x more are decoded, for their memo only.
HEAD = 8
#: The same for a buffer that never wrapped (its first entry's ``record_id`` is 0): its first entries are
#: the job's start-up (process group creation, barriers, parameter broadcasts), which do not run the
#: training step's code paths: the real short jobs of ``tests/data`` need their first 53.
UNWRAPPED_HEAD = 128
#: Groups that pg_status reports and no newest entry names are named from the first this many entries
#: (decoded for it when fewer were): pg_status still reports their progress.
NAMES_HEAD = 32
#: Below this many entries a full decode of a JSON dump is as cheap.
MIN_ENTRIES = 1024
#: Entries between the first ones and the newest must hold at least this share of the newest entries' bytes
#: for the two decodes to pay: they and the checks cost a dump about what a few dozen of PyTorch's entries
#: with their frames cost to decode, so a quarter (32 entries) always pays; otherwise the whole file is decoded (and then
#: reduced from its newest entries all the same: :func:`newest_of_decoded`).
SKIP_SHARE = 0.25

#: a memo store behind an object: BINPUT, LONG_BINPUT (protocols 2, 3) or MEMOIZE (4, 5: the index implied)
_PUT = rb"(?:q[\s\S]|r[\s\S]{4}|\x94)?"
_ENTRIES_KEY = re.compile(rb"(?:X\x07\x00\x00\x00|\x8c\x07)entries" + _PUT + rb"\]" + _PUT + rb"\(")
_SUFFIX = re.compile(rb"eu" + _PUT + rb"\.\Z")
#: the first key of the first entry: its string opcode (BINUNICODE, or SHORT_BINUNICODE from protocol 4)
_FIRST_KEY = re.compile(rb"\}" + _PUT + rb"\((?:X([\s\S]{4})|\x8c([\s\S]))")
#: an integer: BININT1, BININT2 or BININT
_INT = rb"(?:K([\s\S])|M([\s\S]{2})|J([\s\S]{4}))"
_INT_VALUE = re.compile(_INT)
#: behind a key's first occurrence: its BINPUT (the memo index later entries refer to), then an integer
_PUT_AND_INT = re.compile(rb"(?:q([\s\S])|r([\s\S]{4}))" + _INT)
#: behind a key's first occurrence in protocol 4 and 5: MEMOIZE, then an integer
_MEMOIZE_AND_INT = re.compile(rb"\x94" + _INT)
_FRAME = 0x95
#: Frames of a protocol 4/5 dump followed (Python's pickler writes one per 64 KiB); more: a full decode.
MAX_FRAMES = 4096

#: (top-level dict whose ``entries`` are the newest entries, total entry count, pg_id -> [name, desc] of
#: the groups in the first entries, "every skipped entry completed": a check run only when asked, the
#: skipped entries when they were decoded (None: not decoded); "Any" quoted: typing is not imported at
#: run time, see sentinel.fr.records)
Recent = tuple[dict[str, "Any"], int, dict[int, list[str]], Callable[[], bool], "list[Any] | None"]


class ByteView:
    """Random access to a dump's bytes: a ``bytes`` object, or an open file read lazily with ``pread``.

    A large dump is only ever needed at its two ends (header and first entries, newest entries): read
    from a file, the middle — three quarters of a 2,000-entry dump — is never read nor copied. The front
    starts at :data:`CHUNK` bytes, the back at half that, and each doubles while a search needs more; a short read (the file shrank)
    raises, which :func:`decode_recent` turns into "decode the whole file".
    """

    CHUNK = 1 << 16

    #: The back first read from a JSON dump: its newest entries repeat their stack frames in full, and
    #: growing the back copies what it holds.
    JSON_BACK = 1 << 18

    def __init__(
        self, data: bytes | None = None, *, fd: int = -1, size: int = 0, back: int = CHUNK // 2
    ) -> None:
        self.fd = fd
        self.size = len(data) if data is not None else size
        self.front = data if data is not None else b""
        self.back = data if data is not None else b""
        if data is None:
            self._grow_back(back)

    def _grow_front(self, want: int) -> None:
        have = len(self.front)
        n = min(self.size, max(want, 2 * have, self.CHUNK))
        if n > have:  # what was read stays: only the new part is read
            self.front += self._pread(n - have, have)

    def _grow_back(self, want: int) -> None:
        have = len(self.back)
        # half a chunk at first: the newest 128 entries of a PyTorch dump with frames take ~24 KiB
        n = min(self.size, max(want, 2 * have, self.CHUNK // 2))
        if n > have:
            self.back = self._pread(n - have, self.size - n) + self.back

    def _pread(self, n: int, offset: int) -> bytes:
        out = os.pread(self.fd, n, offset)
        if len(out) != n:
            raise ValueError("the file changed while read")
        return out

    def get(self, lo: int, hi: int) -> bytes | memoryview:
        """Bytes ``[lo, hi)`` of the file (a view of what was read when it holds them: never copied
        before the one copy that frames them for the unpickler)."""
        if hi <= len(self.front):
            return memoryview(self.front)[lo:hi]
        start_back = self.size - len(self.back)
        if lo >= start_back:
            return memoryview(self.back)[lo - start_back : hi - start_back]
        if hi - lo > self.size // 2:  # most of the file: read it once as a whole
            self._grow_front(self.size)
            return self.front[lo:hi]
        return self._pread(hi - lo, lo)

    def span(self, lo: int, hi: int) -> tuple[bytes, int, int]:
        """Bytes ``[lo, hi)`` as ``(data, start, end)``: a range of what was read when it holds them (no
        copy: :class:`~sentinel.fr.safepickle.PartsReader` frames it for the unpickler), else read now."""
        if hi <= len(self.front):
            return self.front, lo, hi
        start_back = self.size - len(self.back)
        if lo >= start_back:
            return self.back, lo - start_back, hi - start_back
        return bytes(self.get(lo, hi)), 0, hi - lo

    def through(self, hi: int) -> bytes:
        """The first ``hi`` bytes, and maybe more (read once: a search over them runs in place)."""
        have = len(self.front)
        if hi > have:
            self.front += self._pread(hi - have, have)
        return self.front

    def find(self, needle: bytes, lo: int, hi: int) -> int:
        """First offset of ``needle`` in ``[lo, hi)``, -1 when none; reads forward only as far as needed."""
        while True:
            if not self.front:
                self._grow_front(self.CHUNK)
            covered = min(hi, len(self.front))
            pos = self.front.find(needle, lo, covered)
            if pos >= 0 or covered >= hi:
                return pos
            self._grow_front(2 * len(self.front))


def decode_recent(data: bytes | ByteView, keep: int) -> Recent | None:
    """The newest ``keep`` entries (:data:`Recent`), or None."""
    try:
        return _decode_recent(data if isinstance(data, ByteView) else ByteView(data), keep)
    except Exception:  # any doubt: the caller decodes the whole file
        return None


def _decode_recent(view: ByteView, keep: int) -> Recent | None:
    size = view.size
    header = bytes(view.get(0, 3))
    if header[:1] != b"\x80" or not 2 <= header[1] <= 5:
        return None
    view._grow_front(view.CHUNK)
    memoize = header[1] >= 4  # MEMOIZE: memo indices implied by the count of objects stored before
    if header[2] == _FRAME:  # framed (Python's pickler from protocol 4): searched and decoded without
        unframed = _unframed(view)  # the frame headers, which may split anything
        if unframed is None:
            return None
        view, size = unframed, unframed.size
    # behind the header (pg_config, pg_status): the literal is found with bytes.find (a fast scan; a
    # regex search over the header cost more than decoding it), the regex checks what follows
    literal = _key(b"entries", memoize)
    pos = 0
    while True:
        pos = view.front.find(literal, pos)
        if pos >= 0:
            key = _ENTRIES_KEY.match(view.front, pos)
            if key is not None and key.end() + 64 <= len(view.front):
                break
            if key is None:
                pos += 1
                continue
        if len(view.front) >= min(size, 1 << 24):
            return None
        pos = max(0, len(view.front) - 64)
        view._grow_front(2 * len(view.front))
    suffix = _SUFFIX.search(bytes(view.get(size - 16, size)))
    if suffix is None:
        return None
    start, end = key.end(), size - 16 + suffix.start()
    first = _FIRST_KEY.match(bytes(view.get(start, start + 16)))
    if first is None:
        return None
    # the first key of entry 0 is a string followed by its memo index: every later entry refers to it
    length = int.from_bytes(first.group(1), "little") if first.group(1) is not None else first.group(2)[0]
    after = start + first.end() + length
    tag = bytes(view.get(after, after + 5))
    zero_filled = None  # with MEMOIZE: whether the header stored at memo index 0 (see _memo_kept)
    if tag[:1] == b"q":
        memo_index = tag[1]
    elif tag[:1] == b"r":
        memo_index = int.from_bytes(tag[1:5], "little")
    elif tag[:1] == b"\x94" and memoize:
        header_memo = _decode_prefix(view, start)[0].memo.copy()
        memo_index = len(header_memo) + 1  # (the entry dict is stored first)
        zero_filled = 0 in header_memo
    else:
        return None
    needle = b"(" + _ref(memo_index)  # MARK then the first key: the start of an entry dict, and only of one
    marks = _Marks(view, needle, start, end)
    # entry starts are found from the front (the head) and from the back (the tail) only: the middle
    # of the file is never scanned, and the total comes from the record ids (checked below)
    if zero_filled is None:
        ids = _record_ids(view, start)
    else:  # the record_id key's memo index: from the first entry decoded
        first_end = marks.from_front(1)
        ids = None if first_end is None else _record_ids_memoized(view, first_end)
    wrapped = ids is None or ids[0] != 0
    if not wrapped and size < ByteView.CHUNK:
        return None  # a short job's whole file: decoded in full (see newest_of_decoded)
    first_n = HEAD if wrapped else UNWRAPPED_HEAD
    if ids is not None and ids[1] - ids[0] + 1 < first_n + keep + int(SKIP_SHARE * keep):
        return None  # (read from the ids of the first and the last entry, before any search)
    head_end = marks.from_front(first_n)
    tail_start = marks.from_back(keep)
    if head_end is None or tail_start is None or tail_start - head_end < SKIP_SHARE * (end - tail_start):
        return None  # too little would be skipped to pay for the two decodes and the checks
    head_reader, head = _decode_prefix(view, head_end)
    top = head_reader.top
    if not isinstance(head, list) or len(head) != first_n:
        return None
    front = head  # the first entries decoded so far (for the group names)
    memo_source = head_reader
    decoded_end, decoded_n = head_end, first_n
    step = first_n
    tail_parts = [view.span(tail_start, end)]
    while True:
        tail_reader = plain_unpickler([(b"\x80\x02](", 0, 4), *tail_parts, (b"e.", 0, 2)])
        # hand over the memo as the proxy: CPython 3.11 drops the values when a plain dict is assigned
        handed = None if memoize else memo_source.memo.copy()
        tail_reader.memo = memo_source.memo
        try:
            tail = tail_reader.load()
            if handed is not None and not _explicit_memo_kept(
                handed, tail_reader, lambda: b"".join([b"\x80\x02](", *_joined(tail_parts), b"e."])
            ):
                return None
            break
        except pickle.UnpicklingError as exc:
            if "Memo value not found" not in str(exc) or decoded_end >= tail_start:
                return None
        # the tail refers to something first pickled later than the head (a code path that ran later):
        # decode further entries, only for their memo, and retry (each step 4x the last)
        step *= 4
        upto = marks.from_front(step)
        upto = tail_start if upto is None or upto > tail_start else upto
        chunk = _decode_more(view, memo_source, (decoded_end, upto), decoded_n if memoize else -1)
        if chunk is None:
            return None
        memo_source, decoded_end, decoded_n = chunk[0], upto, decoded_n + len(chunk[1])
        if len(front) < NAMES_HEAD:
            front = front + chunk[1]
    if not isinstance(tail, list) or len(tail) != keep:
        return None
    if not _memo_kept(tail_parts, memoize=memoize, zero_filled=zero_filled):
        return None
    # record ids consecutive from the first entry to the last: one C-level comparison per part (an
    # entry that is not a dict or has no id raises, and any doubt means a full decode)
    head_ids = [e["record_id"] for e in head]
    tail_ids = [e["record_id"] for e in tail]
    first_id = head_ids[0]
    if type(first_id) is not int or type(tail_ids[-1]) is not int:
        return None
    total = tail_ids[-1] - first_id + 1
    if total < first_n + keep or head_ids != list(range(first_id, first_id + first_n)):
        return None
    if tail_ids != list(range(first_id + total - keep, first_id + total)):
        return None
    top["entries"] = tail
    names = _group_names(front[:NAMES_HEAD])
    if len(front) < NAMES_HEAD and _unnamed(top.get("pg_status"), names, tail):
        upto = marks.from_front(NAMES_HEAD)
        upto = tail_start if upto is None or upto > tail_start else upto
        if upto > decoded_end:
            chunk = _decode_more(view, memo_source, (decoded_end, upto), decoded_n if memoize else -1)
            if chunk is None:
                return None
            memo_source = chunk[0]
            names = _group_names((front + chunk[1])[:NAMES_HEAD])
    memo = memo_source.memo

    def kept(parts: list[tuple[bytes, int, int]]) -> bool:
        return _memo_kept(parts, memoize=memoize, zero_filled=zero_filled)

    def skipped_done() -> bool:
        try:
            return _skipped_done(
                view.through(tail_start),
                memo,
                kept,
                head=head,
                tail=tail,
                needle=marks.needle,
                lo=head_end,
                hi=tail_start,
            )
        except Exception:  # any doubt: not shown completed
            return False

    return top, total, names, skipped_done, None


def _key(text: bytes, memoize: bool) -> bytes:
    """A key string as the pickler writes it: SHORT_BINUNICODE from protocol 4, else BINUNICODE."""
    return b"\x8c" + bytes([len(text)]) + text if memoize else b"X" + len(text).to_bytes(4, "little") + text


def _ref(index: int) -> bytes:
    """A reference to memo ``index``: BINGET or LONG_BINGET."""
    return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")


def _unframed(view: ByteView) -> ByteView | None:
    """The dump without its FRAME headers, followed from the first (each says how long its frame is),
    read whole: the unpickler treats a FRAME as a no-op once its bytes are there, and a search or a
    decode of part of the file must not meet one (Python's pickler starts a frame wherever 64 KiB are
    full: inside an entry's first bytes as well). None past :data:`MAX_FRAMES` frames."""
    data = bytes(view.get(0, view.size))
    pieces = [data[:2]]
    pos = 2
    while pos + 9 <= len(data) and data[pos] == _FRAME:
        if len(pieces) > MAX_FRAMES:
            return None
        end = pos + 9 + int.from_bytes(data[pos + 1 : pos + 9], "little")
        pieces.append(data[pos + 9 : end])
        pos = end
    pieces.append(data[pos:])
    return ByteView(b"".join(pieces))


class _TopReader:
    """What :func:`_decode_prefix` returns: the unpickler (for its memo) and the top-level dict."""

    __slots__ = ("reader", "top")

    def __init__(self, reader: Any, top: dict[str, Any]) -> None:
        self.reader, self.top = reader, top

    @property
    def memo(self) -> Any:
        return self.reader.memo


def _decode_prefix(view: ByteView, hi: int) -> tuple[_TopReader, list[Any] | None]:
    """The file's bytes ``[0, hi)`` decoded as a whole pickle (the lists and the top-level dict closed
    behind them): the memo they define, exactly, and the entries among them."""
    reader = plain_unpickler([view.span(0, hi), (b"eu.", 0, 3)])
    top = reader.load()
    if not isinstance(top, dict):
        raise ValueError("not a dict")
    entries = top.get("entries")
    return _TopReader(reader, top), entries if isinstance(entries, list) else None


def _decode_more(
    view: ByteView, memo_source: Any, span: tuple[int, int], before: int
) -> tuple[Any, list[Any]] | None:
    """The entries in bytes ``[lo, hi)`` and an unpickler whose memo holds what comes before ``hi``:
    decoded with the memo of ``memo_source`` (which read what comes before); with MEMOIZE (``before``:
    how many entries precede ``lo``, -1 without), whose indices count every object stored before and
    are only right in a decode from the start, from the start of the file. None when not a list."""
    lo, hi = span
    if before >= 0:
        whole, entries = _decode_prefix(view, hi)
        return None if entries is None or len(entries) < before else (whole, entries[before:])
    reader = plain_unpickler([(b"\x80\x02](", 0, 4), view.span(lo, hi), (b"e.", 0, 2)])
    handed = memo_source.memo.copy()
    reader.memo = memo_source.memo
    entries = reader.load()
    if not _explicit_memo_kept(
        handed, reader, lambda: b"".join([b"\x80\x02](", *_joined([view.span(lo, hi)]), b"e."])
    ):
        return None
    return (reader, entries) if isinstance(entries, list) else None


def _memo_kept(parts: list[tuple[bytes, int, int]], *, memoize: bool, zero_filled: bool | None) -> bool:
    """Whether a decode of ``parts`` handed another decode's memo read every reference as the full
    decode does. A MEMOIZE (protocols 4 and 5) stores at an index the unpickler keeps by itself, not
    one in the file: CPython's, handed a memo whose index 0 is filled (``zero_filled``), stores every
    MEMOIZE there (:func:`_memoize_stores_at_zero`). References to the indices stored before then read
    the full decode's values and those past them miss (the caller decodes more from the start); bytes
    that may refer to index 0 (the top-level dict in Python's pickles) are refused. Protocols 2 and 3
    store by explicit index, the full decode's (``memoize`` False): a MEMOIZE there is not looked for,
    as no pickler writes one."""
    if not memoize:
        return True
    if any(
        data.find(b"h\x00", a, b) >= 0 or data.find(b"j\x00\x00\x00\x00", a, b) >= 0 for data, a, b in parts
    ):
        return False
    return bool(zero_filled) and _memoize_stores_at_zero()


def _joined(parts: list[tuple[bytes, int, int]]) -> list[bytes]:
    return [bytes(memoryview(data)[a:b]) for data, a, b in parts]


def _explicit_memo_kept(handed: dict[int, Any], reader: Any, stream: Callable[[], bytes]) -> bool:
    """Whether a decode of protocol 2 or 3 bytes by ``reader``, handed the memo ``handed`` (a copy taken
    before), read every reference as the full decode does although it did not start at the file's start.
    These protocols store by explicit index, the full decode's, but the unpickler runs a MEMOIZE in any
    protocol: it stores at the count of slots it filled itself since it was handed the memo (CPython keeps
    no count of the handed ones), where the full decode stores at the count of every slot filled before,
    another index, read back otherwise by a later reference. With F slots filled that ``handed`` lacked,
    every MEMOIZE stored in a slot from 0 to F. A pickler's BINPUTs fill fresh indices above every slot
    filled before, so where the fresh ones all lie above F (a decode of the newest entries, behind the
    skipped middle), the slots from 0 to F hold ``handed``'s objects still, or stay empty: then no
    MEMOIZE stored anything else. Otherwise (a MEMOIZE, or a decode right behind the first entries) the
    decoded ``stream`` is read opcode by opcode for a MEMOIZE, which only a hand-made file holds. Not seen: a MEMOIZE of the very object its
    slot holds already (it changes nothing here) followed by a reference to where the full decode
    stored it, which a file whose memo indices skip some (no pickler's) can make hold a value here."""
    after: dict[int, Any] = reader.memo.copy()
    slots = range(len(after) - len(handed) + 1)  # (slots are only ever added)
    # each holds handed's object, or is empty in both (one C-level pass)
    missing = itertools.repeat(_MISSING)
    if all(map(operator.is_, map(after.get, slots, missing), map(handed.get, slots, missing))):
        return True
    import pickletools  # (here: not a cost of every analysis)

    return not any(op.code == "\x94" for op, _, _ in pickletools.genops(stream()))


_MISSING = object()


@functools.cache
def _memoize_stores_at_zero() -> bool:
    """Whether this Python's unpickler, handed another's memo (index 0 filled), stores every MEMOIZE at
    index 0 (CPython does not hand over the count it stores at) — what :func:`_memo_kept` relies on."""
    first = plain_unpickler(b"\x80\x04\x8c\x01a\x94\x8c\x01b\x94\x86.")
    first.load()
    probe = plain_unpickler(b"\x80\x04\x8c\x01c\x94\x8c\x01d\x94h\x01\x87.")
    probe.memo = first.memo
    loaded = probe.load()
    stored: dict[Any, Any] = probe.memo.copy()
    return loaded == ("c", "d", "b") and stored == {0: "d", 1: "b"}


def _group_names(entries: list[Any]) -> dict[int, list[str]]:
    """pg_id -> [name, desc] of the groups these entries name."""
    names: dict[int, list[str]] = {}
    for e in entries:
        pg = e.get("process_group")
        if type(e.get("pg_id")) is int and isinstance(pg, list | tuple) and len(pg) == 2:
            names.setdefault(e["pg_id"], [str(pg[0]), str(pg[1])])
    return names


def _unnamed(status: Any, names: dict[int, list[str]], newest: list[Any]) -> bool:
    """Whether pg_status reports a group that neither ``names`` nor the ``newest`` entries name (True in
    doubt: the names are looked for further). The newest entries' pg_ids are read only for a group the
    names miss."""
    if not isinstance(status, dict):
        return True
    try:
        missing = [k for k in map(int, status) if k not in names]
        return bool(missing) and not {e.get("pg_id") for e in newest}.issuperset(missing)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return True


def _record_ids(view: ByteView, start: int) -> tuple[int, int] | None:
    """The ``record_id`` of the first and of the last entry, read from the bytes: the key's first
    occurrence behind the entries' start (its text, then the BINPUT of its memo index, then the value's
    integer opcode), and the last reference to that memo index with an integer behind it. None when not
    found so. A guess from bytes (the same bytes inside a string would mislead it): it only decides how
    the file is decoded, whose record ids are checked after."""
    front = view.front
    key = _key(b"record_id", False)
    at = front.find(key, start)
    if at < 0:
        return None
    first = _PUT_AND_INT.match(front, at + len(key))
    if first is None:
        return None
    short, long, *value = first.groups()
    ref = b"h" + short if short is not None else b"j" + long
    back = view.back
    pos = back.rfind(ref)
    last = None if pos < 0 else _INT_VALUE.match(back, pos + len(ref))
    if last is None:
        return None
    return _int_of(*value), _int_of(*last.groups())


def _record_ids_memoized(view: ByteView, first_end: int) -> tuple[int, int] | None:
    """:func:`_record_ids` of a dump with MEMOIZE: the first entry decoded (``[0, first_end)``, its
    memo exact) names the key's memo index, whose last reference with an integer behind it gives the
    last entry's."""
    reader, entries = _decode_prefix(view, first_end)
    indices = [i for i, v in reader.memo.copy().items() if type(v) is str and v == "record_id"]
    if entries is None or len(entries) != 1 or len(indices) != 1 or type(entries[0]) is not dict:
        return None
    first = entries[0].get("record_id")
    ref = _ref(indices[0])
    back = view.back
    pos = back.rfind(ref)
    last = None if pos < 0 else _INT_VALUE.match(back, pos + len(ref))
    if type(first) is not int or last is None:
        return None
    return first, _int_of(*last.groups())


def _int_of(one: bytes | None, two: bytes | None, four: bytes | None) -> int:
    if one is not None:
        return one[0]
    return (
        int.from_bytes(two, "little")
        if two is not None
        else int.from_bytes(four or b"", "little", signed=True)
    )


def newest_of_decoded(top: dict[str, Any], keep: int) -> Recent | None:
    """The newest ``keep`` entries of a dump decoded in full, as :func:`decode_recent` gives them: for a
    short job's file small enough to be read whole (under :attr:`ByteView.CHUNK`), whose first entries
    (its start-up) memoize only part of what the newest refer to, so that decoding these alone would need
    most of the middle decoded first; and for a file whose two-ended decode was in doubt. The reduction
    costs per entry and these checks a fixed amount, so reducing only the newest pays once enough
    entries are skipped. None when fewer than half as many more
    entries than ``keep`` would be skipped; the caller's checks refuse a cut that splits a collective
    (:func:`continues_skipped`).
    Group names come from the first :data:`NAMES_HEAD` entries, as :func:`decode_recent` reads them, when
    pg_status reports a group the newest entries do not name; the skipped entries are decoded, so whether
    they leave an op pending is followed entry by entry."""
    entries = top.get("entries")
    if type(entries) is not list or len(entries) < keep + keep // 2:
        return None
    skipped, tail = entries[:-keep], entries[-keep:]
    names: dict[int, list[str]] = {}
    if _unnamed(top.get("pg_status"), names, tail):
        first = skipped[:NAMES_HEAD]
        if not all(type(e) is dict for e in first):
            return None
        names = _group_names(first)
    view = dict(top)
    view["entries"] = tail

    def skipped_done() -> bool:
        batches = _Batches()
        try:
            return all(map(batches.step, skipped)) and batches.closed_by(tail)
        except Exception:  # any doubt: not shown completed
            return False

    return view, len(entries), names, skipped_done, skipped


def continues_skipped(skipped: list[Any], oldest: dict[Any, Any]) -> bool:
    """Whether a group's first entry among the newest (``oldest``, by pg_id) may continue a collective
    begun in the skipped entries, which were decoded: its seq (``collective_seq_id``, else ``seq_id``, as
    the reduction reads it) is that of its group's last skipped entry, and it is not a send/recv by name
    (the reduction folds entries of one seq into one column: ops of a coalesced collective; cut there, the
    newest entries would hold a part of it, read as a mismatch against a peer that holds it whole). Also
    True when in doubt (an entry that is not a dict). The skipped entries are read from their end until
    every group is met."""
    left = dict(oldest)
    try:
        for e in reversed(skipped):
            first = left.pop(e.get("pg_id"), None)
            if first is not None and _seq_of(first) == _seq_of(e):
                name = first.get("profiling_name")
                if type(name) is not str or op_name(name) not in P2P:
                    return True
            if not left:
                break
    except (AttributeError, TypeError):  # not a dict, or an unhashable pg_id
        return True
    return False


def _seq_of(e: dict[str, Any]) -> Any:
    seq = e.get("collective_seq_id")
    return e.get("seq_id") if seq is None else seq


@functools.cache
def _not_retired(ref: bytes) -> re.Pattern[bytes]:
    """The key ``retired`` (memo reference ``ref``) followed by NEWFALSE or NONE."""
    return re.compile(re.escape(ref) + b"[\x89N]")


#: The parts of the skipped middle decoded around its unretired entries (bytes) may be at most this share
#: of it: past that (a job of little else than send/recv), the full decode costs about as much.
MAX_DECODED_SHARE = 0.5


def _skipped_done(
    data: bytes,
    memo: Any,
    kept: Callable[[list[tuple[bytes, int, int]]], bool],
    *,
    head: list[Any],
    tail: list[Any],
    needle: bytes,
    lo: int,
    hi: int,
) -> bool:
    """Whether no entry the decode skipped — the first :data:`HEAD` (decoded) and those in bytes ``[lo,
    hi)`` (the middle, never decoded in full) — leaves an op pending in the full decode's reduction.
    ``data``: the file's bytes through ``hi``; ``kept``: :func:`_memo_kept` for a decode with ``memo``.

    An entry is done when it is retired, or when it is a member of a coalesced batch whose completed
    closing entry the reduction lets close it (:class:`_Batches`: ProcessGroupNCCL writes every
    ``batch_isend_irecv`` member ``retired`` False forever, and only the ``nccl:coalesced`` entry that
    follows carries the batch's state; see :func:`sentinel.fr.summary._close_batch`).

    The middle is searched as bytes: PyTorch's pickler writes ``retired`` in every entry, as a bool
    (NEWTRUE / NEWFALSE), after the key string memoized once (by value) and referenced by BINGET (index
    below 256) or LONG_BINGET after its first use in the first entry; CPython's pickler (the same
    layout for plain data) memoizes a key string once per object. So an entry not retired holds the key's
    reference followed by NEWFALSE (or NONE, as CPython writes None), which one C-level regex search over
    the middle finds; the same bytes inside a string or a number only cost more decoding. Any other way
    the middle could name the key — a second memoized copy, its text (BINUNICODE or any other string
    opcode), a head memo holding it under several indices or none — means "not shown": the caller
    decodes the whole file.

    Every hit is then decoded, not read from bytes: the entry that holds it (from the entry start before
    it, found as :class:`_Marks` finds them) and the one after it (where ProcessGroupNCCL writes the closing
    entry of a batch's last member), all such spans in one decode with the first entries' memo (a
    reference to a value first pickled elsewhere in the middle fails the decode: a full decode). The
    spans must decode to entries with consecutive record ids between the first and the newest entries
    (adjacent to them where a span touches them) and must cover every hit. :class:`_Batches` then follows
    the first entries and the spans in file order: an entry not completed must be a send/recv (a batch
    member) whose group has no other batch open; a batch closes at a completed ``nccl:coalesced`` entry
    of the same group and ``p2p_seq_id``, exactly where the reduction drops its members; a batch still
    open at the end of a span is a doubt, unless the span ends at the newest entries, where the batch's
    closer must follow among them, completed, with nothing else of its group pending before it (the
    newest entries are reduced as decoded: a closer there that is not completed, or none, leaves the
    skipped members pending in the full decode only), and read as a closer without the skipped members
    (:meth:`_Batches.closed_by`). Entries between spans hold no hit: retired, so
    neither pending nor able to leave a batch open (no batch is open at a span's end).

    Not seen, by design: opcode sequences neither pickler writes (a bool behind POP, a LONG_BINGET of an
    index below 256) and entries without the key (PyTorch writes it in every entry), which a hand-made
    file could hold — as it could simply state anything in a dump that reads well."""
    batches = _Batches()
    # (the first entries all completed, the common case, in one C-level pass)
    if not all(type(e) is dict and entry_completed(e) for e in head) and not all(map(batches.step, head)):
        return False
    indices = [i for i, v in memo.copy().items() if type(v) is str and v == "retired"]
    if len(indices) != 1:
        return False
    (index,) = indices
    ref = _ref(index)
    if data.find(b"retired", lo, hi) >= 0:
        return False
    pattern = _not_retired(ref)
    hit = pattern.search(data, lo, hi)
    if hit is not None or batches.open:
        # (an iterator: a middle of nothing but hits holds millions of them)
        hits = (m.start() for m in pattern.finditer(data, hit.start() if hit else hi, hi))
        spans = _spans(data, needle, hits, lo, hi, from_lo=bool(batches.open))
        if spans is None:
            return False
        stream = b"".join([b"\x80\x02]("] + [b"](" + data[a:b] + b"e" for a, b in spans] + [b"e."])
        reader = plain_unpickler(stream)
        handed = memo.copy()
        reader.memo = memo
        parts = reader.load()
        if not kept([(data, a, b) for a, b in spans]):  # (see _memo_kept)
            return False
        if data[1] < 4 and not _explicit_memo_kept(handed, reader, lambda: stream):  # (data[1]: protocol)
            return False
        if type(parts) is not list or len(parts) != len(spans):
            return False
        last = head[-1]["record_id"]
        for (a, b), part in zip(spans, parts, strict=True):
            if type(part) is not list:
                return False
            ids = [e["record_id"] for e in part]
            if not ids or type(ids[0]) is not int or ids != list(range(ids[0], ids[0] + len(ids))):
                return False
            if ids[0] <= last or (a == lo and ids[0] != last + 1) or (a > lo and ids[0] == last + 1):
                return False
            last = ids[-1]
            if not all(batches.step(e) for e in part) or (batches.open and b != hi):
                return False
        if last >= tail[0]["record_id"] or (last == tail[0]["record_id"] - 1) != (spans[-1][1] == hi):
            return False
    return batches.closed_by(tail)


def _spans(
    data: bytes, needle: bytes, hits: Iterator[int], lo: int, hi: int, *, from_lo: bool
) -> list[tuple[int, int]] | None:
    """Byte spans ``[a, b)`` of whole entries in ``[lo, hi)`` that cover each hit's entry and the entry
    after it (``from_lo``: also the first entry at ``lo`` and the one after it), merged where they touch;
    None when an entry start is not where it must be, or past :data:`MAX_DECODED_SHARE` of the middle.
    Linear in the middle's size however many hits it holds (a string of a million of them in one entry
    included): a hit inside the last span but its final entry is covered as it is, one in its final
    entry extends it by the entry after, and the entry start before any other hit is searched no further
    back than the last span's end (an entry boundary)."""
    budget = MAX_DECODED_SHARE * (hi - lo)
    spans: list[tuple[int, int]] = []
    final = -1  # offset of the dict opcode of the last span's final entry
    final_pos = -1  # and of its needle
    for n, hit in enumerate(itertools.chain((lo,), hits) if from_lo else hits):
        if from_lo and n == 0:
            pos = data.find(needle, lo, hi)
            if pos < 0 or _dict_start(data[pos - 6 : pos], pos) != lo:
                return None
        elif spans and hit < spans[-1][1]:
            if spans[-1][1] == hi or hit < final:
                continue  # its entry and the one after it are in the span
            pos = final_pos
        else:
            pos = data.rfind(needle, spans[-1][1] if spans else lo, hit)
            if pos < 0:
                return None
        start = _dict_start(data[pos - 6 : pos], pos)
        following = data.find(needle, pos + 1, hi)
        after = data.find(needle, following + 1, hi) if following >= 0 else -1
        end = _dict_start(data[after - 6 : after], after) if after >= 0 else hi
        if start < (spans[-1][0] if spans else lo) or end <= hit:
            return None
        final_pos = following if following >= 0 else pos
        final = _dict_start(data[final_pos - 6 : final_pos], final_pos)
        if spans and start <= spans[-1][1]:
            budget -= end - spans[-1][1]
            spans[-1] = (spans[-1][0], end)
        else:
            budget -= end - start
            spans.append((start, end))
        if budget < 0:
            return None
    return spans


class _Batches:
    """What the reduction (:func:`sentinel.fr.summary._close_batch`) leaves pending of the entries it is
    shown in file order, followed without it: per group (the reduction's key: ``process_group[0]``, or the
    ``pg_id`` of an entry without one) the ``p2p_seq_id`` of the coalesced batch whose members are
    pending, and whether the group's previous entry is a send/recv of it (a closer right behind one
    closes the batch: :func:`sentinel.fr.ops.closes_p2p_batch`). Anything the reduction could leave
    pending otherwise — an entry not completed that is not a send/recv, a pending ``nccl:coalesced``
    entry, a member of a second batch while one is open, a field of another type than the reduction
    reads — is a doubt (``False``)."""

    __slots__ = ("follows", "open")

    def __init__(self) -> None:
        self.open: dict[str, int] = {}
        #: per open group, the ``p2p_seq_id`` of its previous entry when that is a send/recv, else None
        self.follows: dict[str, int | None] = {}

    def step(self, e: Any) -> bool:
        """Follow one entry; False when it may stay pending in the reduction."""
        if type(e) is not dict:
            return False
        if entry_completed(e):
            if self.open:  # a completed closer of an open batch drops its members
                read = _batch_fields(e)
                if read is None:
                    return False
                group, seq, is_member, is_closer = read
                if group in self.open:
                    if (
                        is_closer
                        and seq == self.open[group]
                        and closes_p2p_batch(e.get("is_p2p"), seq, self.follows[group])
                    ):
                        del self.open[group], self.follows[group]
                    else:  # (a member completed on its own is followed as a pending one is)
                        self.follows[group] = seq if is_member else None
            return True
        read = _batch_fields(e)
        if read is None or not read[2]:
            return False
        group, seq = read[0], read[1]
        self.follows[group] = seq
        return self.open.setdefault(group, seq) == seq

    def closed_by(self, tail: list[Any]) -> bool:
        """Whether the newest entries close every batch still open, as the reduction of the full buffer
        would, and are read the same without the skipped members: each batch at a completed closer, with
        only more members of that batch pending in its group before it, and a closer that the newest
        entries alone read as a send/recv's too — flagged ``is_p2p``, or right behind a member of its
        batch among them, completed or not (a closer that says False or nothing is known by the member
        before it: as the first of its group's entries among the newest it would be read as a collective
        there)."""
        follows: dict[str, int | None] = {}  # group -> as self.follows, among the newest entries
        for e in tail:
            if not self.open:
                break
            read = _batch_fields(e) if type(e) is dict else None
            if read is None:
                return False
            group, seq, is_member, is_closer = read
            if group not in self.open:
                continue
            if not entry_completed(e):
                if not (is_member and seq == self.open[group]):
                    return False
            elif is_closer and seq == self.open[group]:
                # read alone, the newest entries must know it as a closer too (the skipped members aside)
                if not closes_p2p_batch(e.get("is_p2p"), seq, follows.get(group)):
                    return False
                del self.open[group]
                continue
            follows[group] = seq if is_member else None
        return not self.open


def _batch_fields(e: dict[str, Any]) -> tuple[str, int, bool, bool] | None:
    """(group, ``p2p_seq_id``, a send/recv the reduction keeps as a p2p op, a ``nccl:coalesced`` entry
    that closes a batch of that ``p2p_seq_id`` when one is open) of one entry, read as the reduction reads
    them; None when a field is not of the type it reads (a doubt)."""
    pg, name, seq = e.get("process_group"), e.get("profiling_name"), e.get("p2p_seq_id", -1)
    if type(name) is not str or type(seq) is not int:
        return None
    if type(pg) is tuple and len(pg) == 2 and type(pg[0]) is str and type(pg[1]) is str:
        group = pg[0]
    elif pg is None and type(e.get("pg_id")) is int:
        group = str(e["pg_id"])
    elif type(pg) is list and len(pg) == 2 and type(pg[0]) is str and type(pg[1]) is str:
        group = pg[0]
    else:
        return None
    kind = _NAME_KINDS.get(name)
    if kind is None:
        kind = _name_kind(name)
        if len(_NAME_KINDS) < MAX_NAME_KINDS:
            _NAME_KINDS[name] = kind
    # a closer is known by its name and place, whatever its is_p2p says (2.5 writes False): while a batch
    # of its group is open, the reduction's last pending op there is that batch's member (nothing else is
    # pending), so a closer of the same p2p_seq_id closes it
    closer = kind[1]
    return group, seq, (kind[0] or e.get("is_p2p") is True) and not closer, closer


#: Profiling names whose kind is remembered (per process; a job has a few dozen).
MAX_NAME_KINDS = 4096
_NAME_KINDS: dict[str, tuple[bool, bool]] = {}


def _name_kind(name: str) -> tuple[bool, bool]:
    """(a send/recv by its name, ``coalesced`` without peers: a batch's closing entry)."""
    op = op_name(name)
    return op in P2P, op == COALESCED and p2p_peer(name) is None


class _Marks:
    """Byte offsets of entry dicts, found by scanning forward from the first or back from the end."""

    def __init__(self, view: ByteView, needle: bytes, start: int, end: int) -> None:
        self.view, self.needle, self.start, self.end = view, needle, start, end
        self.front = [start]  # offsets of the needle of entries 0, 1, ... found so far

    def from_front(self, i: int) -> int | None:
        """Offset of entry ``i``'s dict opcode counted from the first entry, None when there are fewer."""
        front = self.front
        while len(front) <= i:
            pos = self.view.find(self.needle, front[-1] + 1, self.end)
            if pos < 0:
                return None
            front.append(pos)
        return front[i] if i == 0 else self._dict_start(front[i])

    def from_back(self, n: int) -> int | None:
        """Offset of the dict opcode of the ``n``-th entry from the end."""
        view, needle = self.view, self.needle
        while True:
            back = view.back
            base = view.size - len(back)
            lo = max(self.start + 1 - base, 0)
            # the n-th needle from the end: one C-level rsplit (the same non-overlapping search from the
            # right as n calls of rfind, which cost more)
            parts = back[lo : self.end - base].rsplit(needle, n)
            if len(parts) == n + 1:
                return self._dict_start(lo + len(parts[0]) + base)
            if base <= self.start + 1:
                return None
            view._grow_back(2 * len(back))

    def _dict_start(self, pos: int) -> int:
        return _dict_start(bytes(self.view.get(pos - 6, pos)), pos)


def _dict_start(before: bytes, pos: int) -> int:
    """Offset of the dict opcode of the entry whose MARK is at ``pos`` (``before``: the 6 bytes before it)."""
    # the dict opcode sits before the MARK: directly (PyTorch), or behind a MEMOIZE, BINPUT, LONG_BINPUT
    if before[5] == 0x7D:
        return pos - 1
    if before[4] == 0x7D and before[5] == 0x94:
        return pos - 2
    if before[3] == 0x7D and before[4] == 0x71:
        return pos - 3
    if before[0] == 0x7D and before[1] == 0x72:
        return pos - 6
    raise ValueError("entry start without a dict opcode")

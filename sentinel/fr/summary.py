"""Reduce one rank's dump to the compact facts the cross-rank analysis needs.

A dump of 2,000 entries with stack frames decodes to ~40,000 Python objects; thousands of ranks of that do
not fit in memory together. Each dump is therefore reduced right after decoding (in a worker process for
large sets) to a :class:`RankSummary`: per process group the last enqueued / completed collective, the
entries not yet completed, and two dense columns indexed by collective sequence number — the match key
(crc32 of what must agree across ranks, see :mod:`sentinel.fr.ops`) and ``time_created_ns``.

Collectives are keyed by (process-group name, ``collective_seq_id``) — ``pg_id`` and ``record_id`` are
rank-local. ``pg_status`` is keyed by the rank-local ``pg_id``; the entries map it to the group name.
A collective counts as completed when it is ``retired`` or its ``state`` is ``completed`` (gloo records
failed collectives as retired and never sets ``state``).
"""

from __future__ import annotations

import json
import marshal
import re
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable
from itertools import pairwise
from operator import attrgetter, itemgetter

from sentinel.fr.errors import FrFormatError, brief, entry_at
from sentinel.fr.loader import RawDump
from sentinel.fr.ops import (
    COALESCED,
    MIXED_BACKENDS,
    P2P,
    UNRECORDED_P2P_BACKENDS,
    backend,
    closes_p2p_batch,
    group_size_hint,
    is_send,
    match_key,
    op_name,
    p2p_peer,
)
from sentinel.fr.records import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

#: Newest entries per dump whose match key is computed (see :func:`summarize`).
KEY_WINDOW = 128
#: Newest point-to-point ops kept per group (:attr:`GroupTrack.p2p_log`): the rank's recent program order.
P2P_LOG = 32
P2P_SEND, P2P_RECV = 0, 1
#: Integers the format carries (seqs, times, ids) are int64 in PyTorch; anything outside is refused.
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
#: Most tensors per entry and dims per tensor shape accepted (a coalesced op carries one per tensor).
MAX_TENSORS = 1 << 16
MAX_DIMS = 64
_INF = float("inf")


class KeyInfo(NamedTuple):
    """What one match key stands for, for messages."""

    op: str
    in_sizes: str
    out_sizes: str
    dtypes: str
    size_hint: int = 0


class Pending(NamedTuple):
    """An entry this rank enqueued that had not completed when it dumped."""

    seq: int
    key: int
    op: str
    t_ns: int
    state: str
    p2p: bool = False
    peer: int = -1  # group-local peer rank of a p2p op, -1 when unknown


class GroupTrack:
    """One rank's view of one process group.

    The records of ``fr analyze`` are plain classes (``__slots__``) and named tuples, not msgspec structs:
    importing msgspec cost a small set's analysis a fifth of its time. Workers send them to the parent as
    plain data (:meth:`to_plain`, :func:`summary_from_plain`).
    """

    __slots__ = (
        "backend",
        "config_ranks",
        "desc",
        "done",
        "enq",
        "first_seq",
        "keys",
        "name",
        "p2p_log",
        "pending",
        "pg_id",
        "repeat_gap",
        "size_hints",
        "started",
        "times",
        "unrecorded_ops",
    )

    def __init__(
        self,
        name: str,
        desc: str,
        *,
        pg_id: int = -1,
        config_ranks: list[tuple[int, int]] | None = None,
        enq: int = -1,
        done: int = -1,
        started: int = -1,
        first_seq: int = 0,
        keys: bytes = b"",
        times: bytes = b"",
        pending: list[Pending] | None = None,
        size_hints: list[int] | None = None,
        p2p_log: bytes = b"",
        unrecorded_ops: int = 0,
        backend: str = "",
        repeat_gap: int = -1,
    ) -> None:
        self.name = name
        self.desc = desc
        self.pg_id = pg_id
        self.config_ranks = config_ranks  # [start, stop) runs: a world of 4,096 is one pair
        self.enq = enq
        self.done = done
        self.started = started
        self.first_seq = first_seq
        self.keys = keys  # array('I'): match key per seq from first_seq, 0 = not in the buffer
        self.times = times  # array('q'): arrival (ns) per seq from first_seq: see _summarize
        self.pending: list[Pending] = [] if pending is None else pending
        self.size_hints: list[int] = [] if size_hints is None else size_hints
        #: the newest recorded send/recv ops (NCCL records them), oldest first, as array('q') pairs
        #: (time_created_ns, direction << 32 | group-local peer): where p2p ops sit in the rank's program order
        self.p2p_log = p2p_log
        #: ops this rank ran in the group that left no entry, counted from ``op_id`` gaps between its newest
        #: collectives (:data:`UNRECORDED_WINDOW`) when the group's backend records no send/recv
        #: (:data:`~sentinel.fr.ops.UNRECORDED_P2P_BACKENDS`: gloo counts them in ``op_id``, writes no entry)
        self.unrecorded_ops = unrecorded_ops
        #: the comm library its entries name (``profiling_name`` ``nccl:...`` / ``gloo:...``), "" for none,
        #: ``mixed`` when they name several
        self.backend = backend
        #: under gloo, the ops that left no entry right after the previous collective like the group's newest
        #: (same match key) — what this rank ran after it in its earlier steps; -1 when no earlier one is in
        #: the window or the backend records its send/recv (see :func:`_gap_after_repeat`)
        self.repeat_gap = repeat_gap

    def to_plain(self) -> tuple[Any, ...]:
        """Builtins only: the fields of :data:`_TRACK_FIELDS`, then the pending ops as plain tuples."""
        return (*_track_values(self), [tuple(p) for p in self.pending])

    @classmethod
    def from_plain(cls, plain: Any) -> GroupTrack:
        """The track :meth:`to_plain` described."""
        self = cls.__new__(cls)
        (  # the order of _TRACK_FIELDS (a test checks it): assignments, not a setattr() per field
            self.backend,
            self.config_ranks,
            self.desc,
            self.done,
            self.enq,
            self.first_seq,
            self.keys,
            self.name,
            self.p2p_log,
            self.pg_id,
            self.repeat_gap,
            self.size_hints,
            self.started,
            self.times,
            self.unrecorded_ops,
            pending,
        ) = plain
        self.pending = [Pending(*p) for p in pending]
        return self


#: What :meth:`GroupTrack.to_plain` sends of a track besides its pending ops.
_TRACK_FIELDS = tuple(f for f in GroupTrack.__slots__ if f != "pending")
_track_values = attrgetter(*_TRACK_FIELDS)


class RankSummary:
    """Everything the analysis keeps of one rank's dump."""

    __slots__ = (
        "config_world",
        "first_t_ns",
        "groups",
        "keys",
        "last_t_ns",
        "median_duration_ms",
        "n_entries",
        "rank",
        "skipped_p2p",
        "source",
        "version",
    )

    def __init__(
        self,
        rank: int,
        source: str,
        version: str,
        n_entries: int,
        *,
        groups: list[GroupTrack],
        keys: dict[int, KeyInfo],
        first_t_ns: int = 0,
        last_t_ns: int = 0,
        median_duration_ms: float = -1.0,
        skipped_p2p: bool = False,
        config_world: int = 0,
    ) -> None:
        self.rank = rank
        self.source = source
        self.version = version
        self.n_entries = n_entries
        self.groups = groups
        self.keys = keys
        self.first_t_ns = first_t_ns
        self.last_t_ns = last_t_ns
        self.median_duration_ms = median_duration_ms  # NCCL duration_ms of completed collectives; -1: none
        #: completed send/recv entries were skipped (:attr:`sentinel.fr.loader.RawDump.skipped_p2p`)
        self.skipped_p2p = skipped_p2p
        #: one more than the highest rank any pg_config entry lists, named group or not (0: none): every
        #: rank listed is a rank of the job (:func:`_apply_config`)
        self.config_world = config_world

    def waits(self) -> bool:
        """Whether a group of this rank still waits (pg_status) or holds an op not completed."""
        return any(g.pending or g.enq > g.done for g in self.groups)

    def to_plain(self) -> tuple[Any, ...]:
        """Builtins only, in ``__init__`` order: what a decoding worker sends (see :func:`summary_from_plain`)."""
        return (
            self.rank,
            self.source,
            self.version,
            self.n_entries,
            [g.to_plain() for g in self.groups],
            {k: tuple(v) for k, v in self.keys.items()},
            self.first_t_ns,
            self.last_t_ns,
            self.median_duration_ms,
            self.skipped_p2p,
            self.config_world,
        )


def summary_from_plain(plain: Any) -> RankSummary:
    """The :class:`RankSummary` of :meth:`RankSummary.to_plain`'s tuple. A worker's message is decoded
    with the no-globals unpickler, so it can hold builtins only; a malformed one raises TypeError or
    ValueError."""
    rank, source, version, n_entries, groups, keys, first_t, last_t, median, skipped_p2p, config_world = plain
    return RankSummary(
        rank,
        source,
        version,
        n_entries,
        groups=[GroupTrack.from_plain(g) for g in groups],
        keys={k: KeyInfo(*v) for k, v in keys.items()},
        first_t_ns=first_t,
        last_t_ns=last_t,
        median_duration_ms=median,
        skipped_p2p=skipped_p2p is True,
        config_world=int(config_world),
    )


class _Builder:
    __slots__ = (
        "backend",
        "desc",
        "done",
        "enq",
        "hints",
        "keys",
        "last_seq",
        "member",
        "name",
        "ops",
        "p2p_count",
        "p2p_log",
        "pending",
        "pg_id",
        "seqs",
        "times",
    )

    def __init__(self, name: str, desc: str, pg_id: int) -> None:
        self.name = name
        self.desc = desc
        self.pg_id = pg_id
        # columns as lists, made arrays once in _finish: list.append costs a fifth of array.append, and
        # four appends per entry were a quarter of reducing a dump
        self.seqs: list[int] = []
        self.ops: list[int] = []  # op_id of each seq's (last) entry: maps gloo's pg_status to seqs
        self.keys: list[int] = []
        self.times: list[int] = []
        self.pending: list[Pending] = []
        self.enq = -1
        self.done = -1
        self.last_seq = INT_MIN - 1  # no seq: an entry without one (-1) is not a coalesced op of the last
        self.hints: set[int] = set()
        self.p2p_log: list[int] = []
        # p2p_seq_id of the newest collective: the group's send/recv so far, whether or not their entries
        # are still in the buffer (a counter that only grows: the newest entry's is the group's largest)
        self.p2p_count = 0
        self.backend: str | None = None  # None until the first entry names one
        # (p2p_seq_id, len(seqs) then) of the group's newest send/recv while no collective came after it:
        # the member a closing entry right behind it follows. A collective entry either adds a column
        # (len(seqs) moves on) or folds into the last one (which clears this), so no entry pays for it
        self.member: tuple[int, int] | None = None


def _int(value: Any, what: str, source: str) -> int:
    if type(value) is int:
        if INT_MIN <= value <= INT_MAX:
            return value
    elif type(value) is float and value.is_integer() and INT_MIN <= value < INT_MAX:
        return int(value)  # read losslessly as the integer, as entry fields are (sentinel.fr.coerce)
    elif isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        number = int(value)
        if INT_MIN <= number <= INT_MAX:
            return number
    raise FrFormatError(f"{source}: {what} is {brief(value)}, expected a 64-bit integer")


class _BadField(Exception):
    """What is wrong with a field of the current entry; :func:`_summarize` says which entry it is."""


def _sizes(value: Any, what: str) -> str:
    """Canonical text of a list of tensor shapes (lists of ints), checked for shape and bounds in one
    linear pass; :class:`_BadField` otherwise (never ``str()`` of hostile nesting)."""
    if value is None:
        return ""
    if type(value) not in (list, tuple) or len(value) > MAX_TENSORS:
        raise _BadField(f"{what} is {brief(value)}, expected a list of shapes")
    parts = []
    for shape in value:
        if type(shape) not in (list, tuple) or len(shape) > MAX_DIMS:
            raise _BadField(f"{what} holds {brief(shape)}, expected a shape")
        for dim in shape:
            if type(dim) is not int or not INT_MIN <= dim <= INT_MAX:
                raise _BadField(f"{what} holds dimension {brief(dim)}, expected a 64-bit integer")
        parts.append(",".join(map(str, shape)))
    return "[" + "],[".join(parts) + "]" if parts else ""


def _dtypes(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if type(value) not in (list, tuple) or len(value) > MAX_TENSORS:
        raise _BadField(f"{what} is {brief(value)}, expected a list of names")
    for d in value:
        if not isinstance(d, str):  # a str subclass reads as its text, as in every other field
            raise _BadField(f"{what} holds {brief(d)}, expected a dtype name")
    return list(value)


class _Inexact(Exception):
    """An entry field without the exact type PyTorch writes (or a bad field): the dump goes through
    :func:`sentinel.fr.coerce.coerce_entries`, which coerces it or names what is wrong."""


#: The fields of every entry of a PyTorch 2.x dump (one C call reads them all); a dump with one missing
#: (older formats) reads each entry with ``dict.get`` and these defaults instead.
_FIELDS = (
    ("profiling_name", None),  # required: the default fails the type check
    ("time_created_ns", None),  # required
    ("process_group", None),
    ("pg_id", -1),
    ("collective_seq_id", None),
    ("op_id", -1),
    ("p2p_seq_id", -1),
    ("state", None),
    ("time_discovered_started_ns", None),
    ("retired", None),
    ("is_p2p", None),
    ("input_sizes", None),
    ("output_sizes", None),
    ("input_dtypes", None),
    ("output_dtypes", None),
)
_read_fields = itemgetter(*(name for name, _ in _FIELDS))


def summarize(dump: RawDump, *, coerce: bool = False) -> RankSummary:
    """Reduce a shape-checked dump to its :class:`RankSummary`; FrFormatError names any bad field.

    Match keys are computed for the newest :data:`KEY_WINDOW` entries and every entry not completed; older
    completed entries keep only seq and time (a mismatch that persists recurs every step, so the recent
    window sees it, and this halves the cost of reducing a full 2,000-entry buffer).

    Entries are read as decoded, each field accepted only with the exact type PyTorch writes. A dump with
    any other value (or a bad field) is read again through :func:`sentinel.fr.coerce.coerce_entries`
    (msgspec), which checks every entry first, so the error named is the first bad field in the file.
    ``coerce``: go through msgspec at once, whose checks in C cost a third of those in Python per entry:
    worth its import (a small set's whole decode) when many dumps are read (:func:`~sentinel.fr.dumpset.summarize_dir`).
    Both ways give the same summary.
    """
    if not coerce:
        try:
            return _summarize(dump, dump.entries, False, _marshal_pack)
        except _Inexact:
            pass
    from sentinel.fr.coerce import coerce_entries, coerce_entries_fast, pack

    first = dump.n_entries - len(dump.entries)
    fast = coerce_entries_fast(dump.entries, dump.source, first)
    if fast is not None:
        try:
            return _summarize(dump, fast, True, pack, fast=True)
        except _Inexact:  # a group or any other field not as the format says: named the exact way
            pass
    return _summarize(dump, coerce_entries(dump.entries, dump.source, first), True, pack)


#: Completed entries with a start, a completion and a duration needed to judge how starts were recorded.
MIN_TIMED_ENTRIES = 8


def starts_polled(entries: list[Any], coerced: bool) -> bool:
    """Whether the dump's ``time_discovered_started_ns`` are the moments a poller found the collectives
    started rather than when the device started them: on most completed entries that carry a start, a
    completion and a ``duration_ms``, start and completion were discovered closer together than half the
    time the device itself measured between them — impossible for the device's own times, the rule for
    PyTorch's ProcessGroupNCCL, whose watchdog thread finds both in one pass (every 100 ms) when it
    retires the work. Such a start lags the device's by up to the poll period, a different amount on
    every rank (each watchdog has its own phase): per-rank lags from it would be the watchdogs' phases,
    steady enough over a few dozen collectives to pass for a straggler. ``entries``: the decoded dicts,
    or structs when ``coerced``."""
    checked = together = 0
    for e in entries:
        if coerced:
            started, completed, duration = (
                e.time_discovered_started_ns,
                e.time_discovered_completed_ns,
                e.duration_ms,
            )
        elif type(e) is dict:
            started = e.get("time_discovered_started_ns")
            completed = e.get("time_discovered_completed_ns")
            duration = e.get("duration_ms")
        else:
            continue
        if (
            type(started) is not int
            or type(completed) is not int
            or type(duration) is not float
            or not 0.0 < duration < _INF
            or completed < started
        ):
            continue
        checked += 1
        together += (completed - started) < duration * 5e5  # half the duration, in ns
    return checked >= MIN_TIMED_ENTRIES and 2 * together > checked


def _marshal_pack(fields: tuple[Any, ...]) -> bytes:
    return marshal.dumps(fields, 2)  # version 2: no table of references built per call


def _summarize(
    dump: RawDump,
    entries: list[Any],
    coerced: bool,
    pack: Callable[[tuple[Any, ...]], bytes],
    *,
    fast: bool = False,
    created_times: bool = False,
) -> RankSummary:
    """The reduction. ``coerced``: the entries are msgspec structs of exactly typed fields
    (:func:`sentinel.fr.coerce.coerce_entries`); else the decoded dicts, whose fields are checked here
    (:class:`_Inexact` on anything else). ``fast``: structs of :func:`~sentinel.fr.coerce.coerce_entries_fast`,
    whose ``process_group`` is checked here; any error raises :class:`_Inexact` (the caller reads the dump
    again with :func:`~sentinel.fr.coerce.coerce_entries`, whose error is the first in the file). ``pack``:
    bytes that tell apart what must agree across ranks (sizes, dtypes), one C call. ``created_times``: a
    collective's arrival is its ``time_created_ns`` even where a start was recorded (the starts were
    polled, :func:`starts_polled`); the dump is read again that way when the first reading finds so."""
    source = dump.source
    builders: dict[str, _Builder] = {}
    key_cache: dict[tuple[str, bytes], tuple[int, int]] = {}
    shared_keys = _shared_keys(pack)
    check_pg = fast or not coerced
    inexact = fast or not coerced  # every error is retried through coerce_entries
    key_info: dict[int, KeyInfo] = {}
    # profiling name -> (a send/recv, its backend, the closing entry of a coalesced batch)
    p2p_names: dict[str, tuple[bool, str, bool]] = {}
    keyed_from = len(entries) - KEY_WINDOW
    first_t = 0
    last_t = 0
    index = 0
    b: _Builder | None = None
    last_pg: Any = None  # the process_group value of the previous entry (b is its group)
    pg_builders: dict[tuple[str, str], _Builder] = {}
    durations: list[float] = []
    imin, imax = INT_MIN, INT_MAX
    timed = False  # some entry recorded a start
    try:
        for index, e in enumerate(entries):
            if coerced:  # msgspec structs (sentinel.fr.coerce): attribute reads, no checks
                profiling = e.profiling_name
                t = e.time_created_ns
                pg = e.process_group
                pg_id = e.pg_id
                seq = e.collective_seq_id
                op_id = e.op_id
                p2p_seq = e.p2p_seq_id
                state = e.state
                started_ns = e.time_discovered_started_ns
                retired = e.retired
                is_p2p_flag = e.is_p2p
                in_sizes = e.input_sizes
                out_sizes = e.output_sizes
                in_dtypes = e.input_dtypes
                out_dtypes = e.output_dtypes
                seq_id = e.seq_id
                duration = e.duration_ms
            else:
                if type(e) is not dict:
                    raise _Inexact
                try:
                    row = _read_fields(e)
                except KeyError:
                    row = tuple(e.get(name, default) for name, default in _FIELDS)
                (
                    profiling,
                    t,
                    pg,
                    pg_id,
                    seq,
                    op_id,
                    p2p_seq,
                    state,
                    started_ns,
                    retired,
                    is_p2p_flag,
                    in_sizes,
                    out_sizes,
                    in_dtypes,
                    out_dtypes,
                ) = row
                seq_id = e.get("seq_id")
                duration = e.get("duration_ms")
                # what msgspec checks (sentinel.fr.coerce._Entry), with the exact types only
                if (
                    type(profiling) is not str
                    or type(t) is not int
                    or type(pg_id) is not int
                    or type(op_id) is not int
                    or type(p2p_seq) is not int
                    or not (
                        imin <= t <= imax
                        and imin <= pg_id <= imax
                        and imin <= op_id <= imax
                        and imin <= p2p_seq <= imax
                    )
                    or (seq is not None and (type(seq) is not int or not imin <= seq <= imax))
                    or (
                        started_ns is not None
                        and (type(started_ns) is not int or not imin <= started_ns <= imax)
                    )
                    or (seq_id is not None and (type(seq_id) is not int or not imin <= seq_id <= imax))
                    or (state is not None and type(state) is not str)
                    or (retired is not None and type(retired) is not bool)
                    or (is_p2p_flag is not None and type(is_p2p_flag) is not bool)
                    or (duration is not None and type(duration) is not float)
                ):
                    raise _Inexact
            if pg is not last_pg or pg is None:
                # the entry's group: entries of several groups interleave, and a pickle shares one tuple
                # per group, so a tuple seen before is found by hash, checked and looked up only once
                b = pg_builders.get(pg) if type(pg) is tuple else None
                if b is None:
                    if pg is None:
                        name, desc = str(pg_id), ""
                    elif check_pg and (
                        type(pg) not in (tuple, list)
                        or len(pg) != 2
                        or type(pg[0]) is not str
                        or type(pg[1]) is not str
                    ):
                        raise _Inexact
                    else:
                        name, desc = pg
                    b = builders.get(name)
                    if b is None:
                        # "undefined" is PyTorch's placeholder for "no description"
                        b = builders[name] = _Builder(name, "" if desc == "undefined" else desc, pg_id)
                    if type(pg) is tuple:
                        pg_builders[pg] = b
                last_pg = pg
            assert b is not None
            # NCCL: when the device started it, a closer measure of when this rank arrived than the
            # host-side enqueue (gloo leaves the field empty: time_created_ns it is), unless the starts
            # were stamped by a poller (starts_polled: the dump is read again with created_times)
            if t < first_t or first_t == 0:
                first_t = t
            if t > last_t:  # noqa: PLR1730 - cheaper than a call per entry
                last_t = t
            state = state or "scheduled"
            if started_ns:
                timed = True
                arrived = t if created_times else started_ns
                if state == "scheduled":
                    state = "started"  # NCCL saw it start on the device (gloo leaves the field empty)
            else:
                arrived = t
            completed = retired is True or state == "completed"
            named = p2p_names.get(profiling)
            if named is None:
                op = op_name(profiling)
                named = p2p_names[profiling] = (op in P2P, backend(profiling), op == COALESCED)
            is_p2p, bk, closes = named
            if bk != b.backend:
                b.backend = bk if b.backend is None else MIXED_BACKENDS
            key = 0
            if index >= keyed_from or not completed or is_p2p:
                fields = (in_sizes, out_sizes, in_dtypes, out_dtypes)
                try:  # one C call names what must agree; only a new combination is checked field by field
                    ck = (profiling, pack(fields))
                except (OverflowError, RecursionError, TypeError, ValueError):
                    ck = (profiling, b"")  # not serializable: the checks below name what is wrong
                cached = key_cache.get(ck) if ck[1] else None
                if cached is None:
                    known = shared_keys.get(ck) if ck[1] else None
                    if known is None:
                        in_sizes = _sizes(fields[0], "input_sizes")
                        out_sizes = _sizes(fields[1], "output_sizes")
                        dtypes = _dtypes(fields[2], "input_dtypes")
                        dtypes += _dtypes(fields[3], "output_dtypes")
                        known = _new_key(profiling, fields, (in_sizes, out_sizes), dtypes)
                        if 0 < len(ck[1]) <= _SHARED_KEY_BYTES:
                            shared_keys[ck] = known
                    key_info.setdefault(known[0], known[2])
                    cached = key_cache[ck] = known[:2]
                key, hint = cached
                if hint:
                    b.hints.add(hint)
            # a batch's closing entry by its place (sentinel.fr.ops.closes_p2p_batch): the send/recv it
            # follows is the group's previous entry, completed or not
            if (
                is_p2p
                or is_p2p_flag is True
                or (
                    closes
                    and (member := b.member) is not None
                    and closes_p2p_batch(
                        is_p2p_flag, p2p_seq, member[0] if member[1] == len(b.seqs) else None
                    )
                )
            ):
                peers = p2p_peer(profiling)
                if peers is not None:
                    send = is_send(profiling)
                    local_peer = peers[1] if send else peers[0]
                    if not 0 <= local_peer < 1 << 24:  # no group has that many ranks: unknown peer
                        local_peer = -1
                    code = (P2P_SEND if send else P2P_RECV) << 32 | (local_peer & 0xFFFFFFFF)
                    b.p2p_log.extend((arrived, code))
                    if len(b.p2p_log) > 4 * P2P_LOG:
                        del b.p2p_log[: -2 * P2P_LOG]
                    b.member = (p2p_seq, len(b.seqs))
                else:
                    local_peer = -1
                    if closes:
                        if b.pending:
                            _close_batch(
                                b.pending, p2p_seq, True, completed, state, arrived if started_ns else None
                            )
                        b.member = None  # the batch is closed: another closer behind it follows no member
                    else:
                        b.member = (p2p_seq, len(b.seqs))
                if not completed:  # (arrival, as the log and the collectives' time column measure it)
                    b.pending.append(Pending(p2p_seq, key, profiling, arrived, state, True, local_peer))
                continue
            if seq is None:
                seq = seq_id if seq_id is not None else -1
            if seq == b.last_seq:
                b.member = None  # a collective after the send/recv
                if closes and b.pending:
                    _close_batch(b.pending, seq, False, completed, state, None)
                # ops of one coalesced collective share its seq: fold their keys together
                if key and b.keys[-1]:
                    b.keys[-1] = zlib.crc32(key.to_bytes(4, "little"), b.keys[-1]) or 1
                b.ops[-1] = op_id
            else:
                b.seqs.append(seq)
                b.ops.append(op_id)
                b.keys.append(key)
                b.times.append(arrived)
                b.last_seq = seq
                b.p2p_count = p2p_seq
            if seq > b.enq:  # noqa: PLR1730 - a call per entry costs more than the comparison
                b.enq = seq
            if not completed:
                b.pending.append(Pending(seq, key, profiling, t, state))
            else:
                if seq > b.done:  # noqa: PLR1730 - a call per entry costs more than the comparison
                    b.done = seq
                if duration is not None and 0.0 <= duration < _INF:  # NaN, inf: no duration
                    durations.append(duration)
    except (FrFormatError, _Inexact, _BadField) as exc:
        if inexact:  # the error named must be the first bad field of the file: coerce_entries checks them all
            raise _Inexact from None
        if isinstance(exc, _BadField):
            raise FrFormatError(f"{_entry_at(dump, entries, index)}: {exc}") from None
        raise
    except (
        KeyError,
        TypeError,
        IndexError,
        AttributeError,
        ValueError,
        OverflowError,
        RecursionError,
    ) as exc:
        if inexact:
            raise _Inexact from None
        raise FrFormatError(f"{_entry_at(dump, entries, index)}: malformed ({type(exc).__name__})") from None
    if timed and not created_times and starts_polled(entries, coerced):
        return _summarize(dump, entries, coerced, pack, fast=fast, created_times=True)
    groups = [_finish(b) for b in builders.values()]
    _apply_status(dump, groups, source, {b.pg_id: b for b in builders.values() if b.pg_id >= 0})
    config_world = _apply_config(dump, groups)
    return RankSummary(
        rank=dump.rank,
        source=source,
        version=dump.version,
        n_entries=dump.n_entries,
        groups=groups,
        keys=key_info,
        first_t_ns=first_t,
        last_t_ns=last_t,
        median_duration_ms=sorted(durations)[len(durations) // 2] if durations else -1.0,
        skipped_p2p=dump.skipped_p2p,
        config_world=config_world,
    )


def _close_batch(  # noqa: PLR0917 - called per batch from the hot loop: positional is cheaper
    pending: list[Pending], seq: int, p2p: bool, completed: bool, state: str, t_ns: int | None
) -> None:
    """The ``nccl:coalesced`` entry that closes a batch speaks for its members.

    ProcessGroupNCCL::pointToPoint (torch 2.5+), while coalescing (``batch_isend_irecv``,
    ``_coalescing_manager``), records each op of the batch with no start/end events: the watchdog never
    updates those entries (``state`` scheduled, ``retired`` False, no times, forever); the ``nccl:coalesced``
    entry ``endCoalescing`` records after them (same group, same ``p2p_seq_id`` for send/recv; since 2.7
    also for slow-path coalesced collectives, same ``collective_seq_id``) carries the batch's work. So the
    members still pending at the tail of the group's list (the batch's own ops, recorded just before) take
    its state: dropped when it completed, else its state and ``t_ns`` (for send/recv the batch's device start,
    when it has one; None keeps the member's own time, as a pending collective keeps its enqueue time).
    Members with no closing entry after them (a dump taken mid-batch) are left as they are. A member that
    completed on its own had a work of its own: nothing to settle, but the closer right behind it is still
    its batch's (:func:`sentinel.fr.ops.closes_p2p_batch`), not a collective. Only the tail is scanned:
    the work is the batch's size."""
    n = len(pending)
    while n and pending[n - 1].p2p is p2p and pending[n - 1].seq == seq:
        n -= 1
    if n == len(pending):
        return
    if completed:
        del pending[n:]
        return
    for i in range(n, len(pending)):
        member = pending[i]
        pending[i] = member._replace(state=state, t_ns=member.t_ns if t_ns is None else t_ns)


def _entry_at(dump: RawDump, entries: list[Any], index: int) -> str:
    """Where entry ``index`` is in the file (the recent-tail decoder hands over the newest entries only)."""
    return entry_at(dump.source, entries, index, dump.n_entries - len(entries))


def _new_key(
    profiling: str,
    fields: tuple[Any, Any, Any, Any],
    texts: tuple[str, str],
    dtypes: list[str],
) -> tuple[int, int, KeyInfo]:
    """(match key, group size hint, what the key stands for) of one checked combination."""
    op = op_name(profiling)
    in_sizes = fields[0] or []
    out_sizes = fields[1] or []
    hint = group_size_hint(op, in_sizes, out_sizes)
    in_text, out_text = texts
    text = match_key(op, in_text, out_text, set(dtypes))
    key = zlib.crc32(text.encode()) or 1
    return key, hint, KeyInfo(op, f"[{in_text}]", f"[{out_text}]", ",".join(sorted(set(dtypes))), hint)


#: Match keys of the (profiling name, packed sizes and dtypes) combinations checked so far in this process,
#: by pack function: the ranks of a job share them (data-parallel replicas run the same collectives on the
#: same shapes), so a worker checks and keys each combination once, not once per dump. Bounded.
_SHARED_KEYS: dict[Callable[[tuple[Any, ...]], bytes], dict[tuple[str, bytes], tuple[int, int, KeyInfo]]] = {}
_SHARED_KEYS_MAX = 4096
#: Only combinations packing to at most this many bytes are kept (so the table holds at most a few MiB).
_SHARED_KEY_BYTES = 512


def _shared_keys(
    pack: Callable[[tuple[Any, ...]], bytes],
) -> dict[tuple[str, bytes], tuple[int, int, KeyInfo]]:
    table = _SHARED_KEYS.setdefault(pack, {})
    if len(table) > _SHARED_KEYS_MAX:
        table.clear()
    return table


def _finish(b: _Builder) -> GroupTrack:
    seqs = b.seqs
    keys = array("I", b.keys)
    times = array("q", b.times)
    first = seqs[0] if seqs else 0
    # consecutive seqs (the usual case) are checked in one C-level comparison, not a loop per entry
    if seqs and (seqs[-1] - first + 1 != len(seqs) or seqs != list(range(first, first + len(seqs)))):
        # holes or disorder (ring-buffer oddities): lay the columns out densely by seq
        lo, hi = min(seqs), max(seqs)
        if hi - lo > 4 * len(seqs) + 1024:
            lo = max(lo, hi - 4 * len(seqs) - 1024)
        dense_k = array("I", bytes(4 * (hi - lo + 1)))
        dense_t = array("q", bytes(8 * (hi - lo + 1)))
        for s, k, t in zip(seqs, keys, times, strict=True):
            if s >= lo:
                dense_k[s - lo] = k
                dense_t[s - lo] = t
        first, keys, times = lo, dense_k, dense_t
    return GroupTrack(
        name=b.name,
        desc=b.desc,
        pg_id=b.pg_id,
        enq=b.enq,
        done=b.done,
        first_seq=first,
        keys=keys.tobytes(),
        times=times.tobytes(),
        pending=b.pending,
        size_hints=sorted(b.hints),
        p2p_log=array("q", b.p2p_log[-2 * P2P_LOG :]).tobytes(),
        unrecorded_ops=_unrecorded(b),
        backend=b.backend or "",
        repeat_gap=_gap_after_repeat(b),
    )


def _apply_status(
    dump: RawDump, groups: list[GroupTrack], source: str, builders: dict[int, _Builder]
) -> None:
    by_id = {g.pg_id: g for g in groups if g.pg_id >= 0}
    for pg_id, status in dump.pg_status.items():
        if not isinstance(status, dict):
            raise FrFormatError(f"{source}: pg_status[{brief(pg_id, 20)}] is not a dict")
        key = _int(pg_id, "pg_status key", source)
        group = by_id.get(key)
        if group is None:
            named = dump.pg_names.get(key)
            if named is None or any(g.name == named[0] for g in groups):
                continue  # a group whose entries all left the ring buffer: its name is unknown
            desc = "" if named[1] == "undefined" else named[1]
            group = by_id[key] = GroupTrack(name=named[0], desc=desc, pg_id=key)
            groups.append(group)
        at = f"pg_status[{brief(pg_id, 20)}]:"
        enq = _int(status.get("last_enqueued_collective", -1), f"{at} last_enqueued_collective", source)
        done = _int(status.get("last_completed_collective", -1), f"{at} last_completed_collective", source)
        started = _int(status.get("last_started_collective", -1), f"{at} last_started_collective", source)
        b = builders.get(key)
        if b is not None and (b.p2p_log or (b.p2p_count > 0 and b.backend not in UNRECORDED_P2P_BACKENDS)):
            # a group that ran send/recv (entries of them, or a count of them on its collectives' entries
            # when theirs left the ring buffer): ProcessGroupNCCL's values are the last *work*'s seq, a
            # send/recv's (or its batch's) from the p2p counter (torch 2.5 initWork: isP2P ? seqP2P_ :
            # seqCollective_): a completed recv #8 read as collective #8 marked a pending all_reduce #7
            # completed, and recv #120 completed before all_reduce #7-#50 (all pending) marked every one of
            # them completed. Its entries say where its collectives are (they complete in order on its
            # stream); the count agrees with the newest entries' (sentinel.fr.loader._counts_p2p)
            continue
        if b is not None and _counts_ops(b, enq):
            ascending = _ascending(b.ops)  # once per group, not per value mapped
            enq, done, started = (_seq_of_op(b, v, ascending) for v in (enq, done, started))
        group.enq = max(group.enq, enq)
        group.done = max(group.done, done)
        group.started = max(group.started, started)
    for group in groups:
        if group.done >= 0:
            group.pending = [p for p in group.pending if p.p2p or p.seq > group.done]


#: Most recent collectives per group over which ops that left no entry are counted (p2p the job still runs,
#: not a send/recv at its start).
UNRECORDED_WINDOW = 64


def _unrecorded(b: _Builder) -> int:
    """Ops between this group's newest recorded collectives that left no entry (``op_id`` gaps).

    Keyed on the backend the entries name, never on the gaps alone: only a backend that records no
    send/recv (gloo) leaves a gap for every send/recv it ran. ProcessGroupNCCL writes an entry per
    send/recv, so gaps in NCCL dumps (a wrapped buffer, entries that are simply not there, a coalesced
    batch counted per op) say nothing about p2p and the NCCL rules judge them. 0 as well when the entries
    number no ops (op_id -1) or the group's entries name several backends (two op counters interleave)."""
    ops = b.ops
    first = max(0, len(ops) - 1 - UNRECORDED_WINDOW)
    if b.backend not in UNRECORDED_P2P_BACKENDS or len(ops) < 2 or b.p2p_log or ops[first] < 0:
        return 0
    # the sum of the gaps of an ascending sequence, in O(1): a full 2,000-entry buffer of 16,384 ranks
    # must not cost a Python loop per entry
    return max(0, ops[-1] - ops[first] - (len(ops) - 1 - first))


def _gap_after_repeat(b: _Builder) -> int:
    """Ops that left no entry right after the newest earlier collective with the same match key as the
    group's newest one, within :data:`UNRECORDED_WINDOW`: a training loop repeats, so this is what the
    rank ran after its last collective in its earlier steps (gloo: its send/recv). -1 without an earlier
    one, for other backends, or without op ids. Evidence for a human, not a rule (see the analysis)."""
    keys, ops = b.keys, b.ops
    n = len(keys)
    if b.backend not in UNRECORDED_P2P_BACKENDS or n < 2 or not keys[-1] or ops[-1] < 0:
        return -1
    last = keys[-1]
    for j in range(n - 2, max(-1, n - 2 - UNRECORDED_WINDOW), -1):
        if keys[j] == last:
            return max(0, ops[j + 1] - ops[j] - 1)
    return -1


def _counts_ops(b: _Builder, enq: int) -> bool:
    """Whether this group's pg_status counts *operations* rather than collectives.

    ProcessGroupGloo (torch 2.13) publishes its own op counter there — one that also counts send/recv,
    which it does not record in the flight recorder — while the entries' ``collective_seq_id`` counts
    collectives only; the entries' ``op_id`` is that op counter. ProcessGroupNCCL counts collectives in
    both. Entries are recorded when a collective is enqueued, so the status's last enqueued value is the
    newest entry's: its ``op_id`` under gloo, its ``collective_seq_id`` under NCCL. Only when the two
    differ (the job ran point-to-point ops) and the status names the op id are the values translated."""
    if not b.seqs:
        return False
    newest_seq, newest_op = b.seqs[-1], b.ops[-1]
    return newest_op >= 0 and newest_op != newest_seq and enq == newest_op


def _seq_of_op(b: _Builder, op_id: int, ascending: bool) -> int:
    """The collective seq whose entry is the newest with ``op_id`` at most the given one (-1 passes)."""
    if op_id < 0:
        return op_id
    ops = b.ops
    i = bisect_right(ops, op_id) if ascending else sum(1 for o in ops if o <= op_id)
    if i == 0:  # older than every entry in the ring buffer: just before the first
        return int(b.seqs[0]) - 1 if b.seqs else -1
    return int(b.seqs[i - 1])


def _ascending(values: list[int]) -> bool:
    return all(a <= c for a, c in pairwise(values))


def _apply_config(dump: RawDump, groups: list[GroupTrack]) -> int:
    """Use pg_config when it is sound (NCCL); gloo in torch 2.13 writes one unnamed entry (key, name and
    desc empty) whose ranks are empty once the job made sub-groups and the world's ranks when it made none.

    Returns one more than the highest rank any entry lists (0: none): an unnamed entry belongs to no group
    the entries name, but the ranks it lists are ranks of the job, so the world is at least that large —
    the only trace in gloo dumps of a world-only job's highest rank when that rank left no dump."""
    by_name = {g.name: g for g in groups}
    listed = 0
    for key, cfg in dump.pg_config.items():
        if not isinstance(cfg, dict):
            continue
        name = cfg.get("name", key)
        if not isinstance(name, str):  # a malformed entry: nothing of it is used
            continue
        value = cfg.get("ranks")
        # cached by text (bounded: at most 256 texts of at most 256 KiB)
        runs = _runs_of_text(value) if isinstance(value, str) and len(value) <= 1 << 18 else _runs_of(value)
        if runs:
            listed = max(listed, runs[-1][1])
        group = by_name.get(name) if name else None
        if group is None:
            continue
        if runs:
            group.config_ranks = list(runs)
        if not group.desc and isinstance(cfg.get("desc"), str):
            group.desc = cfg["desc"]
    return listed


def rank_runs(ranks: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct ranks as [start, stop) runs."""
    if ranks and ranks[-1] - ranks[0] + 1 == len(ranks):  # one run (the usual case; ranks are distinct)
        return [(ranks[0], ranks[-1] + 1)]
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


#: Member-list texts parsed so far, by (length, first and last characters): see :func:`_runs_of_text`.
_RUNS_SEEN: dict[tuple[int, str, str], list[tuple[str, tuple[tuple[int, int], ...] | None]]] = {}
_RUNS_SEEN_MAX = 256


def _runs_of_text(text: str) -> tuple[tuple[int, int], ...] | None:
    """Every dump of a job repeats the same member lists (16,384 ranks for the world): parse each once.

    Found again by equality, not by hash: each dump decodes its own copy of the text, whose hash (an
    ``lru_cache`` key) would cost a pass over 100 KiB per dump, where comparing it with the one seen
    is a memcmp. Bounded: at most :data:`_RUNS_SEEN_MAX` texts are kept."""
    seen = _RUNS_SEEN.setdefault((len(text), text[:16], text[-16:]), [])
    for known, runs in seen:
        if known == text:
            return runs
    ranks = _parse_ranks(text)
    runs = tuple(rank_runs(ranks)) if ranks else None
    if sum(map(len, _RUNS_SEEN.values())) >= _RUNS_SEEN_MAX:
        _RUNS_SEEN.clear()
        seen = _RUNS_SEEN.setdefault((len(text), text[:16], text[-16:]), [])
    seen.append((text, runs))
    return runs


def _runs_of(value: Any) -> tuple[tuple[int, int], ...] | None:
    ranks = _parse_ranks(value)
    return tuple(rank_runs(ranks)) if ranks else None


def _parse_ranks(value: Any) -> list[int] | None:
    if isinstance(value, str):
        if len(value) > 1 << 22:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # unusable, as any other member list that is not one
            return None
    if isinstance(value, list) and value and set(map(type, value)) == {int}:
        ranks = sorted(set(value))
        if ranks[0] >= 0 and ranks[-1] < 1 << 24:
            return ranks
    return None

"""Reduce one rank's dump to the compact facts the cross-rank analysis needs (:func:`summarize`).

Thousands of decoded dumps do not fit in memory together, so each is reduced right after decoding to a
:class:`~sentinel.fr.rank_summary.RankSummary`. Collectives are keyed by (process-group name,
``collective_seq_id``): ``pg_id`` and ``record_id`` are rank-local. A collective counts as completed when
it is ``retired`` or its ``state`` is ``completed`` (gloo records failed ones as retired).
"""

from __future__ import annotations

import marshal
import zlib
from collections.abc import Callable
from operator import itemgetter

from sentinel.fr.errors import FrFormatError, brief, entry_at
from sentinel.fr.group_builder import INT_MAX, INT_MIN, GroupBuilder, finish_track
from sentinel.fr.group_tables import apply_config, apply_status
from sentinel.fr.loader import RawDump
from sentinel.fr.ops import (
    COALESCED,
    MIXED_BACKENDS,
    P2P,
    backend,
    closes_p2p_batch,
    group_size_hint,
    is_send,
    match_key,
    op_name,
    p2p_peer,
)
from sentinel.fr.rank_summary import P2P_LOG, KeyInfo, Pending, RankSummary
from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


#: Newest entries per dump whose match key is computed (see :func:`summarize`).
KEY_WINDOW = 128


P2P_SEND, P2P_RECV = 0, 1


#: Most tensors per entry and dims per tensor shape accepted (a coalesced op carries one per tensor).
MAX_TENSORS = 1 << 16


MAX_DIMS = 64


_INF = float("inf")


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
    builders: dict[str, GroupBuilder] = {}
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
    b: GroupBuilder | None = None
    last_pg: Any = None  # the process_group value of the previous entry (b is its group)
    pg_builders: dict[tuple[str, str], GroupBuilder] = {}
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
                        b = builders[name] = GroupBuilder(name, "" if desc == "undefined" else desc, pg_id)
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
    groups = [finish_track(b) for b in builders.values()]
    apply_status(dump, groups, source, {b.pg_id: b for b in builders.values() if b.pg_id >= 0})
    config_world = apply_config(dump, groups)
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

"""What the analysis keeps of one rank's dump (:class:`RankSummary`, one :class:`GroupTrack` per group).

Per group: the last enqueued and completed collective, the ops not completed, and dense columns of match
keys and creation times by sequence number. ``to_plain`` gives builtins only, what a decoding worker sends.
"""

from __future__ import annotations

from operator import attrgetter

from sentinel.fr.records import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any


#: Newest point-to-point ops kept per group (:attr:`GroupTrack.p2p_log`): the rank's recent program order.
P2P_LOG = 32


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
        self.times = times  # array('q'): arrival (ns) per seq from first_seq: see sentinel.fr.summary
        self.pending: list[Pending] = [] if pending is None else pending
        self.size_hints: list[int] = [] if size_hints is None else size_hints
        #: the newest recorded send/recv ops (NCCL records them), oldest first, as array('q') pairs
        #: (time_created_ns, direction << 32 | group-local peer): where p2p ops sit in the rank's program order
        self.p2p_log = p2p_log
        #: ops this rank ran in the group that left no entry, counted from ``op_id`` gaps between its newest
        #: collectives (:data:`sentinel.fr.group_builder.UNRECORDED_WINDOW`) when the group's backend records no send/recv
        #: (:data:`~sentinel.fr.ops.UNRECORDED_P2P_BACKENDS`: gloo counts them in ``op_id``, writes no entry)
        self.unrecorded_ops = unrecorded_ops
        #: the comm library its entries name (``profiling_name`` ``nccl:...`` / ``gloo:...``), "" for none,
        #: ``mixed`` when they name several
        self.backend = backend
        #: under gloo, the ops that left no entry right after the previous collective like the group's newest
        #: (same match key) — what this rank ran after it in its earlier steps; -1 when no earlier one is in
        #: the window or the backend records its send/recv (see :mod:`sentinel.fr.group_builder`)
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
        #: rank listed is a rank of the job (:func:`sentinel.fr.group_tables.apply_config`)
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

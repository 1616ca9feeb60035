"""Reduce a live Flight Recorder snapshot (only active entries) to :class:`~sentinel.fr.heads.FrHeads`.

Turns the probe's ``_dump_fr_trace_json(onlyActive=True)`` object into per-group heads: the last
enqueued/started/completed collective and the in-flight entries with their age. What must survive between
snapshots is kept by the caller: group names by ``pg_id`` (``known_groups``), gloo's op-to-seq mapping
(``op_map``), the groups whose NCCL counters mix collectives and send/recv (``p2p_groups``, read from
entries instead) and the coalesced batches seen closed (:class:`BatchMemory`). Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import msgspec

from sentinel.fr.errors import FrFormatError
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.fr.ops import COALESCED, P2P, entry_completed, op_name, reads_as_p2p

#: Most in-flight entries kept per group (oldest first); the datagram cap trims further.
MAX_IN_FLIGHT = 64
#: Batches remembered as closed per rank (the newest; a pipeline posts a few per step, and a member older
#: than this many batches has long left a real ring buffer's onlyActive view or been settled again)
MAX_CLOSED_BATCHES = 4096

Batch = tuple[str, int]  # (group name, p2p_seq_id)


class BatchMemory:
    """One rank's coalesced p2p batches across live snapshots: the ones seen closed, and what the latest
    snapshot could not settle.

    ``batch_isend_irecv`` coalesces even a single op on NCCL (``_coalescing_manager`` whenever the backend
    supports coalescing), and the member of a batch of one has no work of its own: it stays ``scheduled``,
    without times, forever, while its completed ``nccl:coalesced`` entry is skipped by ``onlyActive``. In
    such a snapshot the member reads exactly like a lone ``isend``/``irecv`` still pending (its own work,
    scheduled, without times unless ``TORCH_NCCL_ENABLE_TIMING``). A snapshot with every entry holds the
    closing entry when there is one (it is newer than its member, so still in the ring buffer): the probe
    takes one when a reduction leaves such an op ``unsettled``, and every completed closing entry a
    reduction sees is remembered in ``closed`` (bounded: the newest ``MAX_CLOSED_BATCHES``), so later
    ``onlyActive`` snapshots drop its members without another full one.

    A batch whose closing entry a snapshot showed *not* completed is remembered in ``open``: when a later
    snapshot lists its member without the closing entry, that entry completed (``onlyActive`` skipped it; it
    cannot have left the ring buffer before its older member), so the batch closes without a full snapshot
    — the case of a batch that waits longer than a tick (a recv through a pipeline bubble).
    """

    __slots__ = ("closed", "open", "unsettled")

    def __init__(self) -> None:
        self.closed: dict[Batch, None] = {}  # insertion-ordered: the oldest is evicted first
        self.open: dict[Batch, None] = {}  # closing entry seen pending (the newest MAX_CLOSED_BATCHES)
        #: of the latest reduction: each lone scheduled op it could not settle, with its age then (s)
        self.unsettled: dict[Batch, float] = {}

    def close(self, batch: Batch) -> None:
        self.open.pop(batch, None)
        _remember(self.closed, batch)

    def saw_open(self, batch: Batch) -> None:
        if batch not in self.closed:
            _remember(self.open, batch)


def _remember(batches: dict[Batch, None], batch: Batch) -> None:
    """Add ``batch`` to an insertion-ordered set of at most MAX_CLOSED_BATCHES, the oldest evicted first."""
    if batch not in batches:
        if len(batches) >= MAX_CLOSED_BATCHES:
            del batches[next(iter(batches))]
        batches[batch] = None


def _as_int(value: Any, what: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise FrFormatError(f"live flight recorder: {what} is {str(value)[:30]!r}, expected an integer")


def reduce_snapshot(
    snapshot: Mapping[str, Any],
    *,
    rank: int,
    now: float,
    known_groups: MutableMapping[int, tuple[str, str]] | None = None,
    op_map: MutableMapping[int, tuple[int, int]] | None = None,
    job_id: str | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    pid: int | None = None,
    batches: BatchMemory | None = None,
    p2p_groups: MutableMapping[int, int] | None = None,
) -> FrHeads:
    """Heads of one rank from a decoded FR JSON snapshot taken at unix time ``now``; ``batches`` (kept by
    the caller across snapshots) learns the closed batches and says which lone ops it could not settle;
    ``p2p_groups`` (kept too) maps each group seen to post send/recv to its newest collective seq (see the
    module docstring)."""
    names = known_groups if known_groups is not None else {}
    ops = op_map if op_map is not None else {}
    memory = batches if batches is not None else BatchMemory()
    mixed = p2p_groups if p2p_groups is not None else {}
    coll_seen: dict[int, int] = {}  # pg_id -> newest collective_seq_id of its entries in this snapshot
    memory.unsettled = {}
    entries = snapshot.get("entries") or []
    if not isinstance(entries, list):
        raise FrFormatError("live flight recorder: 'entries' is not a list")
    now_ns = int(now * 1e9)
    in_flight: dict[str, list[InFlight]] = {}
    enq_from_entries: dict[str, int] = {}
    pairs: dict[int, list[tuple[int, int]]] = {}  # pg_id -> (op_id, collective seq) of its collectives
    closers: dict[tuple[str, int], str] = {}  # (group, p2p seq) -> state of its nccl:coalesced entry
    members: dict[tuple[str, int], int] = {}  # (group, p2p seq) -> its send/recv entries in the snapshot
    last_p2p: dict[str, int] = {}  # group -> p2p seq of its previous entry when that was a send/recv
    for e in entries:
        if not isinstance(e, dict):
            raise FrFormatError("live flight recorder: an entry is not an object")
        pg = e.get("process_group") or [str(e.get("pg_id", "")), ""]
        name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
        desc = "" if desc == "undefined" else desc
        pg_id = _as_int(e["pg_id"], "pg_id") if "pg_id" in e else None
        if pg_id is not None:
            names[pg_id] = (name, desc)
            if e.get("is_p2p") is not True and "op_id" in e and "collective_seq_id" in e:
                pairs.setdefault(pg_id, []).append(
                    (_as_int(e["op_id"], "op_id"), _as_int(e["collective_seq_id"], "collective_seq_id"))
                )
        finished = entry_completed(e)
        profiling = str(e.get("profiling_name", "?"))
        op = op_name(profiling)
        p2p_seq = _as_int(e.get("p2p_seq_id", -1), "p2p_seq_id")
        # a batch's closing entry by its place (sentinel.fr.ops.reads_as_p2p): the send/recv it follows
        # is the group's previous entry in the snapshot
        p2p = reads_as_p2p(op, e.get("is_p2p"), p2p_seq, last_p2p.get(name))
        if pg_id is not None:
            if (p2p or p2p_seq > 0) and (len(mixed) < MAX_OP_MAP or pg_id in mixed):
                mixed.setdefault(pg_id, -1)  # its pg_status counts send/recv work too
            if "collective_seq_id" in e:
                cs = _as_int(e["collective_seq_id"], "collective_seq_id")
                if cs > coll_seen.get(pg_id, -1):
                    coll_seen[pg_id] = cs
        if op in P2P:
            last_p2p[name] = p2p_seq
        else:
            last_p2p.pop(name, None)
        if p2p and (op == COALESCED or op in P2P):  # (the ops of a batch: see _close_batches)
            batch = (name, p2p_seq)
            if op == COALESCED:
                closers[batch] = "completed" if finished else str(e.get("state"))
                if finished:
                    memory.close(batch)
                else:
                    memory.saw_open(batch)
            else:
                members[batch] = members.get(batch, 0) + 1
        if finished:
            continue
        seq = _as_int(e.get("p2p_seq_id" if p2p else "collective_seq_id", -1), "collective_seq_id")
        created = _as_int(e.get("time_created_ns", now_ns), "time_created_ns")
        age = max(0.0, (now_ns - created) / 1e9)
        state = "started" if e.get("state") == "started" else "scheduled"
        in_flight.setdefault(name, []).append(
            InFlight(seq=seq, op=profiling, age_s=age, state=state, p2p=p2p)
        )
        if not p2p:
            enq_from_entries[name] = max(enq_from_entries.get(name, -1), seq)
    if members:
        _close_batches(in_flight, closers, members, memory)
    heads: dict[str, PgHead] = {}
    status = snapshot.get("pg_status") or {}
    if not isinstance(status, dict):
        raise FrFormatError("live flight recorder: 'pg_status' is not an object")
    config = _config_ranks(snapshot.get("pg_config"))
    for pg_id, st in status.items():
        if not isinstance(st, dict):
            raise FrFormatError("live flight recorder: a pg_status value is not an object")
        key = _as_int(pg_id, "pg_status key")
        known = names.get(key)
        if known is None:
            continue
        name, desc = known
        enq = _as_int(st.get("last_enqueued_collective", -1), "last_enqueued_collective")
        done = _as_int(st.get("last_completed_collective", -1), "last_completed_collective")
        started = _as_int(st.get("last_started_collective", -1), "last_started_collective")
        flights = sorted(in_flight.get(name, []), key=lambda f: (f.p2p, f.seq))[:MAX_IN_FLIGHT]
        if key in mixed:  # the status mixes send/recv and collective work: the entries say
            enq, started, done = _seqs_from_entries(flights, max(coll_seen.get(key, -1), mixed[key]))
            mixed[key] = enq
        else:
            enq, done = _collective_seqs(enq, done, sorted(pairs.get(key, ())), key, ops)
        heads[name] = PgHead(
            pg_name=name,
            pg_desc=desc,
            ranks=config.get(name),
            last_enqueued_seq=max(enq, enq_from_entries.get(name, -1)),
            last_started_seq=started,
            last_completed_seq=done,
            in_flight=flights,
        )
    for name, flights in in_flight.items():  # active groups missing from pg_status (older formats)
        if name not in heads:
            seqs = [f.seq for f in flights if not f.p2p]
            heads[name] = PgHead(
                pg_name=name,
                ranks=config.get(name),
                last_enqueued_seq=max(seqs, default=-1),
                last_completed_seq=min(seqs, default=0) - 1,
                in_flight=sorted(flights, key=lambda f: (f.p2p, f.seq))[:MAX_IN_FLIGHT],
            )
    return FrHeads(
        rank=rank,
        t=now,
        job_id=job_id,
        world_size=world_size,
        local_rank=local_rank,
        pid=pid,
        pgs=sorted(heads.values(), key=lambda h: h.pg_name),
    )


def _close_batches(
    in_flight: dict[str, list[InFlight]],
    closers: dict[Batch, str],
    members: dict[Batch, int],
    memory: BatchMemory,
) -> None:
    """Send/recv of a coalesced batch read as the batch (in place).

    ProcessGroupNCCL records each op of a ``batch_isend_irecv`` batch with no start/end events (no work of
    its own: ``state`` scheduled, no completion time, forever) and the batch's work as the ``nccl:coalesced``
    entry that follows (same group and ``p2p_seq_id``). ``onlyActive`` snapshots skip entries with a
    completion time, so every member of every batch still in the ring buffer shows as in flight, its age
    growing, while the batch's completed closing entry is gone: read per op, a healthy pipeline that pauses
    (checkpoint, eval) reads as a job blocked in send/recv. So members take their closing entry's state —
    dropped when it completed (in this snapshot or, remembered in ``memory``, an earlier one) or is absent
    while two or more ops share its seq, or absent after an earlier snapshot showed it pending
    (``memory.open``). A lone scheduled op without one is an op of its own or the member
    of a batch of one, which this snapshot cannot tell apart: it stays, and goes to ``memory.unsettled``
    with its age (the probe settles it from a snapshot with every entry); a lone op that started is its own
    work."""
    for name, flights in in_flight.items():
        kept = []
        for f in flights:
            key = (name, f.seq)
            if not f.p2p or op_name(f.op) not in P2P or key not in members:
                kept.append(f)
                continue
            state = closers.get(key)
            if state is None and (members[key] > 1 or key in memory.closed or key in memory.open):
                state = "completed"
                memory.close(key)
            if state is None:
                kept.append(f)
                if f.state == "scheduled":
                    memory.unsettled[key] = f.age_s
            elif state != "completed":
                kept.append(
                    msgspec.structs.replace(f, state="started" if state == "started" else "scheduled")
                )
        flights[:] = kept


#: Groups whose op-id -> seq pair is remembered (one per process group; jobs have a handful).
MAX_OP_MAP = 4096


def _collective_seqs(
    enq: int, done: int, pairs: list[tuple[int, int]], pg_id: int, ops: MutableMapping[int, tuple[int, int]]
) -> tuple[int, int]:
    """pg_status's last enqueued / completed values as collective seqs (see the module docstring)."""
    if pairs:
        newest_op, newest_seq = pairs[-1]
        if newest_op == enq and newest_op != newest_seq:  # gloo: the status counts ops
            if len(ops) < MAX_OP_MAP or pg_id in ops:
                ops[pg_id] = (newest_op, newest_seq)
            done_seq = max((seq for op, seq in pairs if op <= done), default=pairs[0][1] - 1)
            return newest_seq, done_seq
        if newest_op == newest_seq:
            ops.pop(pg_id, None)
        return enq, done
    learned = ops.get(pg_id)
    if learned is None:
        return enq, done
    op, seq = learned
    if enq == op:  # still at the collective last seen: exact (gloo completes in order)
        return seq, seq if done >= op else seq - 1
    # moved on by at least one collective (how many is unknown until the next snapshot with entries)
    return seq + 1, seq + 1 if done >= enq else seq


def _seqs_from_entries(flights: list[InFlight], newest: int) -> tuple[int, int, int]:
    """(enqueued, started, completed) collective seqs of a group whose status mixes counters, from its
    in-flight entries and ``newest``, the newest collective seq its entries showed (this snapshot or an
    earlier one): collectives complete in order on a group's stream, so the oldest pending one bounds the
    completed; none pending, the group is idle at its newest."""
    pending = [f.seq for f in flights if not f.p2p]
    enq = max(newest, max(pending, default=-1))
    done = min(pending) - 1 if pending else enq
    started = max((f.seq for f in flights if not f.p2p and f.state == "started"), default=done)
    return enq, started, done


def _config_ranks(config: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    if not isinstance(config, dict):
        return out
    for key, cfg in config.items():
        if not isinstance(cfg, dict):
            continue
        name = cfg.get("name", key)
        ranks = cfg.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = [int(x) for x in ranks.strip("[] ").split(",") if x.strip()]
            except ValueError:
                continue
        if isinstance(name, str) and name and isinstance(ranks, list) and ranks:
            out[name] = sorted(r for r in ranks if type(r) is int)
    return out

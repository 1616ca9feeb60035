"""Reduce a live Flight Recorder snapshot (only active entries) to :class:`~sentinel.fr.heads.FrHeads`.

The probe calls ``_dump_fr_trace_json(includeCollectives=True, onlyActive=True)`` in the training process;
this module turns that JSON object into the per-group heads (last enqueued/started/completed collective and
the in-flight entries with their age). Pure: the snapshot time is passed in, no I/O, no torch.

``pg_status`` is keyed by the rank-local ``pg_id``; only entries carry the group name, so the mapping
learned from earlier snapshots is kept in ``known_groups`` (a group with nothing in flight has no entry).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from sentinel.fr.errors import FrFormatError
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.fr.ops import P2P, op_name

#: Most in-flight entries kept per group (oldest first); the datagram cap trims further.
MAX_IN_FLIGHT = 64


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
    job_id: str | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    pid: int | None = None,
) -> FrHeads:
    """Heads of one rank from a decoded FR JSON snapshot taken at unix time ``now``."""
    names = known_groups if known_groups is not None else {}
    entries = snapshot.get("entries") or []
    if not isinstance(entries, list):
        raise FrFormatError("live flight recorder: 'entries' is not a list")
    now_ns = int(now * 1e9)
    in_flight: dict[str, list[InFlight]] = {}
    enq_from_entries: dict[str, int] = {}
    for e in entries:
        if not isinstance(e, dict):
            raise FrFormatError("live flight recorder: an entry is not an object")
        pg = e.get("process_group") or [str(e.get("pg_id", "")), ""]
        name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
        desc = "" if desc == "undefined" else desc
        if "pg_id" in e:
            names[_as_int(e["pg_id"], "pg_id")] = (name, desc)
        if e.get("retired") is True or e.get("state") == "completed":
            continue
        profiling = str(e.get("profiling_name", "?"))
        p2p = e.get("is_p2p") is True or op_name(profiling) in P2P
        seq = _as_int(e.get("p2p_seq_id" if p2p else "collective_seq_id", -1), "collective_seq_id")
        created = _as_int(e.get("time_created_ns", now_ns), "time_created_ns")
        age = max(0.0, (now_ns - created) / 1e9)
        state = "started" if e.get("state") == "started" else "scheduled"
        in_flight.setdefault(name, []).append(
            InFlight(seq=seq, op=profiling, age_s=age, state=state, p2p=p2p)
        )
        if not p2p:
            enq_from_entries[name] = max(enq_from_entries.get(name, -1), seq)
    heads: dict[str, PgHead] = {}
    status = snapshot.get("pg_status") or {}
    if not isinstance(status, dict):
        raise FrFormatError("live flight recorder: 'pg_status' is not an object")
    config = _config_ranks(snapshot.get("pg_config"))
    for pg_id, st in status.items():
        if not isinstance(st, dict):
            raise FrFormatError("live flight recorder: a pg_status value is not an object")
        known = names.get(_as_int(pg_id, "pg_status key"))
        if known is None:
            continue
        name, desc = known
        flights = sorted(in_flight.get(name, []), key=lambda f: (f.p2p, f.seq))[:MAX_IN_FLIGHT]
        heads[name] = PgHead(
            pg_name=name,
            pg_desc=desc,
            ranks=config.get(name),
            last_enqueued_seq=max(
                _as_int(st.get("last_enqueued_collective", -1), "last_enqueued_collective"),
                enq_from_entries.get(name, -1),
            ),
            last_started_seq=_as_int(st.get("last_started_collective", -1), "last_started_collective"),
            last_completed_seq=_as_int(st.get("last_completed_collective", -1), "last_completed_collective"),
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

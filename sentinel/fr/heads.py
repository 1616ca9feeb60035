"""Flight-recorder heads: the live collective progress of one rank, small enough to send every 2 s.

A training process (``sentinel.probe``) reduces its live PyTorch Flight Recorder to these heads and sends
them to the local agent, which forwards them to the aggregator inside its batches. The aggregator's stuck
detector compares heads across the ranks of a job: ranks waiting in collective (group, seq) while other
members never entered it name the culprit.

A collective is identified across ranks by (``pg_name``, ``seq``) — never by pg_id or record_id, which are
rank-local counters.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# Bounds on every list and string of the heads, enforced by msgspec while decoding (the agent's probe socket
# and the aggregator's stream both decode with these types): an object count bound alone let one datagram or
# frame carry lists that cost hundreds of MB once decoded and kept per rank. A 60 KiB datagram cannot carry
# more than these for a real job anyway.
MAX_PGS = 4096
MAX_PG_RANKS = 32768
MAX_IN_FLIGHT = 256
Name = Annotated[str, msgspec.Meta(max_length=512)]


# The heads structs are ``gc=False`` (never tracked by the cyclic garbage collector): the aggregator keeps
# every rank's latest heads — two jobs of 24,576 ranks replace ~50,000 of them every 2 s — and tracked, they
# were half the collector's work at job scale (``bench/aggregator.py --engine --jobs``). They are frozen and hold only scalars and lists of
# each other: they cannot form a cycle.


class InFlight(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One collective (or p2p op) this rank has enqueued but not completed.

    ``unconfirmed``: a lone scheduled send/recv that may instead be the member of a one-op batch that
    already completed (an ``onlyActive`` snapshot lists both alike; ``sentinel.probe`` says which once a
    dump of every entry confirmed it). Its age is its true age; the stuck detector counts no wait from it
    until a later heads reports it confirmed (its thresholds are the aggregator's, not the probe's)."""

    seq: int
    op: Name
    age_s: float
    state: Name = "scheduled"  # scheduled | started
    p2p: bool = False
    unconfirmed: bool = False


class PgHead(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Progress of this rank in one process group."""

    pg_name: Name
    pg_desc: Name = ""
    ranks: Annotated[list[int], msgspec.Meta(max_length=MAX_PG_RANKS)] | None = None  # global ranks, if known
    last_enqueued_seq: int = -1
    last_started_seq: int = -1
    last_completed_seq: int = -1
    in_flight: Annotated[list[InFlight], msgspec.Meta(max_length=MAX_IN_FLIGHT)] = []


#: compute times of this many recent steps travel in each heads (heads every 2 s, steps rarely under 0.25 s)
MAX_STEPS = 8


class StepTime(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """How long this rank computed before its step-``seq`` collective, on its own clock.

    Measured from the completion of the rank's previous collective of its step group (the world group) to
    the start of its next collective in any group: time the rank spent outside communication. Unlike
    entry lateness it is not moved by a peer: a tensor-parallel peer that waits for a straggler waits
    *inside* a collective, so its compute time stays normal.
    """

    seq: int
    compute_s: Annotated[float, msgspec.Meta(ge=0.0, le=86400.0)]


class FrHeads(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One rank's snapshot of collective progress."""

    rank: int
    t: float  # unix time of the snapshot, seconds
    job_id: Name | None = None
    world_size: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: Name | None = None  # filled in by the agent
    gpu: int | None = None  # filled in by the agent from the process → GPU mapping
    pgs: Annotated[list[PgHead], msgspec.Meta(max_length=MAX_PGS)] = []
    steps: Annotated[
        list[StepTime], msgspec.Meta(max_length=MAX_STEPS)
    ] = []  # the latest completed steps' compute times, oldest first (<= MAX_STEPS)

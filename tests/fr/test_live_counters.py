"""Live heads of groups that post send/recv, whose ProcessGroupNCCL ``pg_status`` mixes two counters.

torch 2.5 ``ProcessGroupNCCL::initWork`` gives a work ``isP2P ? seqP2P_ : seqCollective_``; ``workEnqueue``
copies it to ``lastEnqueuedSeq`` and the watchdog to ``lastStartedSeq`` (when higher) and
``lastCompletedSeq`` (each completed work, in list order); the flight recorder dumps them as
``last_enqueued_collective`` / ``last_started_collective`` / ``last_completed_collective``. After a rank's
lone send #120, its status says 120 while its collectives are at 6; an all_reduce #7 enqueued after a
completed recv #120 says enqueued 7, completed 120.

The snapshots here are SYNTHETIC, in that layout: a 2-rank job of six all_reduce steps, each followed by 20
lone sends from rank 0 to rank 1 (rank 1 receives them); then rank 1 enters all_reduce #7 and rank 0 never
does (it computes, or hangs outside any collective, with nothing in flight). No GPU, no NCCL.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import msgspec

from sentinel.fr.heads import FrHeads
from sentinel.fr.reduce import reduce_snapshot
from sentinel.probe import MIXED_STILL_REFRESH_S, Probe
from tests.fr.nccl_synth import mark_pending, started_at
from tests.fr.test_live_batches import T0_NS, _entry

SENDS = 120  # rank 0's lone sends (and rank 1's recvs) by the end of step 6
NOW = T0_NS / 1e9 + 10.0


def _status(enq: int, started: int, done: int) -> dict[str, Any]:
    return {
        "0": {
            "last_enqueued_collective": enq,
            "last_started_collective": started,
            "last_completed_collective": done,
        }
    }


def _snap(status: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    return {"version": "2.10", "pg_config": pg_config, "pg_status": status, "entries": entries}


def _pending_send() -> dict[str, Any]:
    """Rank 0's last lone send, still in flight (it records the group's last collective, #6)."""
    e = _entry(0, "nccl:send 0->1", 6, SENDS, T0_NS + 9 * 10**9, True)
    mark_pending(e, started_at(e))
    return e


def _pending_all_reduce() -> dict[str, Any]:
    """Rank 1 inside all_reduce #7 (it records the group's send/recv counter, 120)."""
    e = _entry(1, "nccl:all_reduce", 7, SENDS, T0_NS + 9 * 10**9, False)
    mark_pending(e, started_at(e))
    return e


def test_a_rank_that_posted_more_send_recv_than_collectives_reads_at_its_collective() -> None:
    """Rank 0: a snapshot while send #120 is in flight (status 120 enqueued, 119 completed), then one with
    nothing in flight (120, 120). Read as collective seqs it was at #120, past the #7 its peer waits in;
    by its entries it is at #6, and stays there when nothing is in flight."""
    groups: dict[int, int] = {}
    known: dict[int, tuple[str, str]] = {}
    first = reduce_snapshot(
        _snap(_status(SENDS, SENDS, SENDS - 1), [_pending_send()]),
        rank=0,
        now=NOW,
        known_groups=known,
        p2p_groups=groups,
    )
    (pg,) = first.pgs
    assert (pg.last_enqueued_seq, pg.last_started_seq, pg.last_completed_seq) == (6, 6, 6)
    assert [(f.op, f.p2p) for f in pg.in_flight] == [("nccl:send 0->1", True)]
    later = reduce_snapshot(
        _snap(_status(SENDS, SENDS, SENDS), []),
        rank=0,
        now=NOW + 2,
        known_groups=known,
        p2p_groups=groups,
    )
    (pg,) = later.pgs
    assert (pg.last_enqueued_seq, pg.last_completed_seq, pg.in_flight) == (6, 6, [])


def test_a_collective_enqueued_after_a_higher_send_recv_seq_reads_pending() -> None:
    """Rank 1 inside all_reduce #7 after recv #120 completed: status (7, 120, 120). Its head is enqueued 7,
    completed 6 (the entry's p2p_seq_id says the group counts send/recv too), not completed 120."""
    heads = reduce_snapshot(_snap(_status(7, SENDS, SENDS), [_pending_all_reduce()]), rank=1, now=NOW)
    (pg,) = heads.pgs
    assert (pg.last_enqueued_seq, pg.last_started_seq, pg.last_completed_seq) == (7, 7, 6)


def test_a_group_without_send_recv_still_reads_its_status() -> None:
    """A collectives-only group (every entry's p2p_seq_id 0) keeps the status as its collective seqs."""
    e = _entry(1, "nccl:all_reduce", 7, 0, T0_NS, False)
    mark_pending(e, started_at(e))
    groups: dict[int, int] = {}
    heads = reduce_snapshot(_snap(_status(7, 7, 6), [e]), rank=1, now=NOW, p2p_groups=groups)
    (pg,) = heads.pgs
    assert (pg.last_enqueued_seq, pg.last_started_seq, pg.last_completed_seq) == (7, 7, 6)
    assert groups == {}


class _Rank:
    """One rank's probe fed from what its flight recorder holds at each snapshot (status and active
    entries), counting the dumps with entries."""

    def __init__(self, rank: int, at: Callable[[int], tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
        self.tick = 0
        self.dumps = 0
        self.at = at
        self.probe = Probe(2.0, "/nonexistent/probe.sock", dump_fn=self._dump, status_fn=self._light)
        self.probe._identity = {"rank": rank, "local_rank": rank, "world_size": 2, "job_id": "j", "pid": 1}

    def _light(self) -> bytes:
        return pickle.dumps({"pg_status": self.at(self.tick)[0]}, protocol=2)

    def _dump(self) -> bytes:
        self.dumps += 1
        status, entries = self.at(self.tick)
        return pickle.dumps(_snap(status, entries), protocol=2)


def _rank0(tick: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if tick == 0:
        return _status(SENDS, SENDS, SENDS - 1), [_pending_send()]
    return _status(SENDS, SENDS, SENDS), []


def _rank1(tick: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return _status(7, SENDS, SENDS), [_pending_all_reduce()]


def _run(ranks: dict[int, _Rank], ticks: int) -> list[tuple[int | None, str]]:
    from sentinel.aggregator.engine import Engine
    from sentinel.wire import Batch
    from tests.aggregator.helpers import hello, sample

    engine = Engine()
    t0 = T0_NS / 1e9 + 9.5
    host = engine.hello(hello("h0", 2), t0)
    for i in range(ticks):
        t = t0 + 2.0 * i
        heads = []
        for r, rank in sorted(ranks.items()):
            rank.tick = i
            raw = rank.probe.snapshot(now=t)
            assert raw is not None
            heads.append(msgspec.structs.replace(msgspec.msgpack.decode(raw, type=FrHeads), gpu=r))
        engine.ingest(host, Batch(seq=i, t=t, samples=[sample(g, t) for g in range(2)], heads=heads), t)
        engine.tick(t)
    return sorted((v.rank, v.reason) for v in engine.book.open.values() if v.kind == "stuck")


def test_the_rank_that_never_enters_the_collective_is_named_whatever_its_counters_say() -> None:
    """Rank 1 waits in all_reduce #7; rank 0, 120 sends further on its counter, never entered it. The stuck
    detector names rank 0; read as collective seqs its status had it inside #7, and rank 1's (7 enqueued,
    120 completed) had it waiting nowhere, so the probe took no dump of its entries."""
    ranks = {0: _Rank(0, _rank0), 1: _Rank(1, _rank1)}
    found = _run(ranks, 8)
    assert found == [(0, "not_entered_collective")], found
    # a group whose counters mix has its active entries read at every tick while it waits (rank 1), and
    # when idle only when its status moves (rank 0: tick 1) or stood still for MIXED_STILL_REFRESH_S
    assert ranks[1].dumps == 8
    assert ranks[0].dumps == 2 + int(12.0 // MIXED_STILL_REFRESH_S)


def test_a_collectives_only_group_takes_no_dump_while_its_status_stands_still_idle() -> None:
    """The cost the rule must not add: a group without send/recv, idle (enqueued = completed), is read from
    its status alone after the first snapshot."""

    def idle(tick: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        e = _entry(0, "nccl:all_reduce", 6, 0, T0_NS, False)
        mark_pending(e, started_at(e))
        return (_status(6, 6, 5), [e]) if tick == 0 else (_status(6, 6, 6), [])

    rank = _Rank(0, idle)
    for i in range(6):
        rank.tick = i
        assert rank.probe.snapshot(now=NOW + 2.0 * i) is not None
    assert rank.dumps == 1

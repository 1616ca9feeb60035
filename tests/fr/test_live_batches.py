"""Live heads of ``batch_isend_irecv`` batches of ONE op, through the probe and the stuck detector.

On NCCL ``batch_isend_irecv`` coalesces even a single op (``distributed_c10d.batch_isend_irecv`` goes
through ``_coalescing_manager`` whenever the backend supports coalescing): ProcessGroupNCCL records the op
with no start/end events of its own (``pointToPoint`` while coalescing: ``state`` scheduled, not retired,
no times, forever) and closes the batch with an ``nccl:coalesced`` entry (``endCoalescing``: same group
and ``p2p_seq_id``) that carries the batch's work. An ``onlyActive`` snapshot skips entries with a
completion time: once the batch completed, its member is listed and its closing entry is not, exactly as a
lone ``isend`` still pending (its own work, scheduled, without times unless TORCH_NCCL_ENABLE_TIMING).

The snapshots here are SYNTHETIC, in that layout (tests/fr/nccl_synth.py's timing fill): a 2-rank job whose
every step is an all_reduce and then one one-op batch per rank (rank 0 sends to rank 1). No GPU, no NCCL.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgspec

from sentinel.fr.heads import FrHeads
from sentinel.fr.reduce import MAX_CLOSED_BATCHES, BatchMemory, reduce_snapshot
from sentinel.probe import Probe
from tests.fr.nccl_synth import mark_completed, mark_pending

T0_NS = 1_700_000_000_000_000_000
STEPS = 6
PEER = {0: "send 0->1", 1: "recv 1<-0"}


def _entry(rank: int, profiling: str, seq: int, p2p_seq: int, t_ns: int, p2p: bool) -> dict[str, Any]:
    shape = [[64]] if profiling != "nccl:coalesced" else []
    return {
        "record_id": 0,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": 0,
        "profiling_name": profiling,
        "time_created_ns": t_ns,
        "input_sizes": shape,
        "output_sizes": shape,
        "input_dtypes": ["Float"] if shape else [],
        "output_dtypes": ["Float"] if shape else [],
        "timeout_ms": 600000,
        "is_p2p": p2p,
    }


def _job(lone_pending: bool) -> dict[int, list[dict[str, Any]]]:
    """Every rank's entries: STEPS steps of an all_reduce and a completed one-op batch; with
    ``lone_pending``, rank 0 then posts a lone ``isend`` (its own work) that rank 1 never receives."""
    out: dict[int, list[dict[str, Any]]] = {}
    for rank in (0, 1):
        entries = []
        for step in range(1, STEPS + 1):
            t = T0_NS + step * 100_000_000
            coll = _entry(rank, "nccl:all_reduce", step, step - 1, t, False)
            mark_completed(coll)
            member = _entry(rank, f"nccl:{PEER[rank]}", step, step, t + 1_000_000, True)
            mark_pending(member, None)  # pointToPoint while coalescing: no events, never updated
            closer = _entry(rank, "nccl:coalesced", step, step, t + 1_000_001, True)
            mark_completed(closer)
            entries += [coll, member, closer]
        if lone_pending and rank == 0:
            lone = _entry(rank, f"nccl:{PEER[rank]}", STEPS, STEPS + 1, T0_NS + 10**9, True)
            mark_pending(lone, None)  # its own work, not started (no timing): scheduled, no times
            entries.append(lone)
        for n, e in enumerate(entries):
            e["record_id"] = e["op_id"] = n
        out[rank] = entries
    return out


def _top(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": STEPS,
                "last_started_collective": STEPS,
                "last_completed_collective": STEPS,
            }
        },
        "entries": entries,
    }


def _active(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``onlyActive`` keeps: the entries without a completion time."""
    return [e for e in entries if e["time_discovered_completed_ns"] is None]


class _Dumps:
    """A rank's two dumps as the probe calls them, counting the full ones."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.active = pickle.dumps(_top(_active(entries)), protocol=2)
        self.all = pickle.dumps(_top(entries), protocol=2)
        self.full_calls = 0

    def dump_active(self) -> bytes:
        return self.active

    def dump_all(self) -> bytes:
        self.full_calls += 1
        return self.all


def _probe(rank: int, dumps: _Dumps) -> Probe:
    probe = Probe(2.0, "/nonexistent/probe.sock", dump_fn=dumps.dump_active, all_fn=dumps.dump_all)
    probe._identity = {"rank": rank, "local_rank": rank, "world_size": 2, "job_id": "j", "pid": 1}
    return probe


def _stuck(
    job: dict[int, list[dict[str, Any]]], ages: list[float]
) -> tuple[list[tuple[int | None, str]], dict[int, _Dumps]]:
    """Each rank's probe snapshots at ``ages`` after the newest entry, fed through the aggregator's engine
    on that virtual clock; the stuck verdicts open at the end, and the dumps (with their call counts)."""
    from sentinel.aggregator.engine import Engine
    from sentinel.wire import Batch
    from tests.aggregator.helpers import hello, sample

    dumps = {r: _Dumps(entries) for r, entries in job.items()}
    probes = {r: _probe(r, d) for r, d in dumps.items()}
    newest = max(e["time_created_ns"] for entries in job.values() for e in entries) / 1e9
    engine = Engine()
    host = engine.hello(hello("h0", 2), newest)
    for i, age in enumerate(ages):
        t = newest + age
        heads = []
        for r, probe in sorted(probes.items()):
            raw = probe.snapshot(now=t)
            assert raw is not None
            heads.append(msgspec.structs.replace(msgspec.msgpack.decode(raw, type=FrHeads), gpu=r))
        engine.ingest(host, Batch(seq=i, t=t, samples=[sample(g, t) for g in range(2)], heads=heads), t)
        engine.tick(t)
    found = sorted((v.rank, v.reason) for v in engine.book.open.values() if v.kind == "stuck")
    return found, dumps


def test_a_paused_job_of_one_op_batches_gives_no_verdict() -> None:
    """The job pauses for 30 min after its last step (a checkpoint): every completed batch's member is in
    each onlyActive snapshot, alone on its seq, its closing entry gone. Read as lone ops they were both ranks
    blocked in send/recv (p2p_stalled); one dump of every entry per rank settles them as batches, and the
    remembered closing entries keep later snapshots settled without another."""
    found, dumps = _stuck(_job(lone_pending=False), [0.5 + 60.0 * i for i in range(30)])
    assert found == []
    assert [d.full_calls for d in dumps.values()] == [1, 1]


def test_a_really_pending_lone_send_is_still_named() -> None:
    """The same job where rank 0 then posts a lone isend that rank 1 never receives: the full dump holds no
    closing entry for it (an op of its own), so it stays in flight and the stuck detector names rank 1. That
    one dump confirms it as an op of its own: it is not checked again."""
    ages = [0.5 + 2.0 * i for i in range(40)]
    found, dumps = _stuck(_job(lone_pending=True), ages)
    assert found == [(1, "not_entered_collective")], found
    assert dumps[0].full_calls == 1
    assert dumps[1].full_calls == 1  # rank 1's one-op batches, settled once


def test_a_batch_seen_open_is_closed_by_its_closers_absence() -> None:
    """A one-op batch whose closing entry an onlyActive snapshot showed pending (a recv through a bubble)
    and a later one no longer lists, while its member is still there, completed: the closer cannot have
    left the ring buffer before its older member. It closes without a dump of every entry."""
    entries = _job(lone_pending=False)[0]
    member, closer = entries[-2], entries[-1]
    mark_pending(closer, None)
    memory = BatchMemory()
    reduce_snapshot(_top(_active(entries)), rank=0, now=T0_NS / 1e9 + 60, batches=memory)
    assert ("0", STEPS) in memory.open and ("0", STEPS) not in memory.unsettled
    heads = reduce_snapshot(_top(_active(entries[:-1])), rank=0, now=T0_NS / 1e9 + 62, batches=memory)
    assert ("0", STEPS) in memory.closed and ("0", STEPS) not in memory.unsettled
    assert all(f.seq != STEPS for pg in heads.pgs for f in pg.in_flight if f.p2p)
    assert member["p2p_seq_id"] == STEPS


def test_the_reduction_remembers_closed_batches_within_a_bound() -> None:
    """reduce_snapshot learns every completed closing entry it sees and leaves a lone scheduled op it cannot
    settle in ``unsettled``; the memory keeps the newest MAX_CLOSED_BATCHES."""
    entries = _job(lone_pending=True)[0]
    memory = BatchMemory()
    active = _top(_active(entries))
    reduce_snapshot(active, rank=0, now=T0_NS / 1e9 + 60, batches=memory)
    assert set(memory.unsettled) == {("0", s) for s in range(1, STEPS + 2)}
    heads = reduce_snapshot(_top(entries), rank=0, now=T0_NS / 1e9 + 60, batches=memory)
    assert set(memory.unsettled) == {("0", STEPS + 1)}
    assert [f.seq for pg in heads.pgs for f in pg.in_flight] == [STEPS + 1]
    again = reduce_snapshot(active, rank=0, now=T0_NS / 1e9 + 60, batches=memory)
    assert [f.seq for pg in again.pgs for f in pg.in_flight] == [STEPS + 1]
    for s in range(MAX_CLOSED_BATCHES + 5):
        memory.close(("x", s))
    assert len(memory.closed) == MAX_CLOSED_BATCHES
    assert ("x", 0) not in memory.closed and ("x", MAX_CLOSED_BATCHES + 4) in memory.closed

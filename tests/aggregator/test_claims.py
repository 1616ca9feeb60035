"""A rank, its heads and its process report belong to the host that runs it: another host's claims on it are
refused and counted, and a hang's blame stays on the real culprit (docs/aggregator.md, "Who speaks for a
rank")."""

from __future__ import annotations

from sentinel.aggregator.claims import CountedRefusals
from sentinel.wire import ProcInfo
from tests.aggregator.helpers import Fleet
from tests.aggregator.test_detectors import feed_cascade, heads, pg, procs


def refusals(f: Fleet) -> dict[str, int]:
    sink = f.engine.fleet.refusals
    assert isinstance(sink, CountedRefusals)
    return sink.counts


def forged_by_h1(f: Fleet, t: float, completed: int, age: float) -> None:
    """h1 speaks for h0's ranks: rank 3 (the culprit, which never entered tp0 seq 11) as waiting in it like
    its peers, and rank 5 as never having entered it — the blame moved to another rank, and with a process
    report claiming h0's ranks as its own."""
    tp0 = list(range(8))
    lies = [
        heads(3, t, [pg("tp0", completed, age, tp0), pg("world", completed - 1)], "h0", 3),
        heads(5, t, [pg("tp0", completed - 1, None, tp0), pg("world", completed - 2)], "h0", 5),
    ]
    claim = [ProcInfo(gpu=g, pid=2000 + g, job_id="j", rank=r, world_size=16) for g, r in ((0, 3), (1, 5))]
    own = procs(1)
    f.send("h1", t, heads=lies, procs=own + claim if t == 4.0 else None)


def test_a_host_sending_heads_for_another_hosts_ranks_is_refused_and_the_blame_stays() -> None:
    f = Fleet()
    for t in (0.0, 2.0):
        feed_cascade(f, t, age=0.1, completed=10 + int(t))
        f.engine.tick(t)
    for t in (4.0, 6.0, 8.0):
        feed_cascade(f, t, age=t - 3.0, completed=12)
        forged_by_h1(f, t, completed=12, age=t - 3.0)  # after the real heads: the last word, were it heard
        f.engine.tick(t)
    stuck = [v for v in f.engine.book.open.values() if v.kind == "stuck"]
    assert [(v.host, v.gpu, v.rank, v.reason) for v in stuck] == [("h0", 3, 3, "not_entered_collective")]
    assert f.engine.stalls["j"].culprits == [3]
    job = f.engine.fleet.jobs["j"]
    assert {job.ranks[r].host for r in range(8)} == {"h0"}
    assert job.ranks[3].pid == 1003  # h0's process, not the one h1 claimed
    assert refusals(f) == {"rank_not_owned": 6, "rank_claimed": 2}


def test_a_rank_whose_holder_lets_go_is_taken_by_the_host_that_claimed_it() -> None:
    """A requeued job: h1's process report names h0's rank 3 while h0 still runs it (refused); h0's process
    ends, and the rank is h1's — its heads are heard from then on, h0's no longer."""
    f = Fleet()
    f.send("h0", 0.0, procs=procs(0))
    moved = ProcInfo(gpu=7, pid=3003, job_id="j", rank=3, world_size=16)
    f.send("h1", 0.0, procs=[moved])
    job = f.engine.fleet.jobs["j"]
    assert job.ranks[3].host == "h0" and refusals(f) == {"rank_claimed": 1}
    own = ProcInfo(gpu=6, pid=3009, job_id="j", rank=9, world_size=16)
    f.send("h1", 0.5, procs=[moved, own])  # a new report, still naming rank 3: the claim keeps waiting
    assert job.ranks[3].host == "h0" and job.ranks[9].host == "h1"
    assert refusals(f) == {"rank_claimed": 2}
    f.send("h0", 1.0, procs=[p for p in procs(0) if p.rank != 3])  # rank 3's process ended on h0
    assert (job.ranks[3].host, job.ranks[3].gpu, job.ranks[3].pid, job.ranks[3].alive) == (
        "h1",
        7,
        3003,
        True,
    )
    f.send("h1", 2.0, heads=[heads(3, 2.0, [pg("world", 4)], "h1", 7)])
    f.send("h0", 2.0, heads=[heads(3, 2.0, [pg("world", 9)], "h0", 3)])
    heard = job.ranks[3].heads
    assert heard is not None and heard.pgs[0].last_completed_seq == 4
    assert refusals(f) == {"rank_claimed": 2, "rank_not_owned": 1}
    assert f.engine.fleet.gpu("h1", 7) is not None and f.engine.fleet.gpu("h1", 7).rank == 3  # type: ignore[union-attr]


def test_a_disconnected_holder_lets_go_and_a_withdrawn_claim_never_kills_the_holders_rank() -> None:
    f = Fleet()
    f.send("h0", 0.0, procs=procs(0))
    f.send("h1", 0.0, procs=[ProcInfo(gpu=0, pid=5, job_id="j", rank=2, world_size=16)])
    f.send("h1", 1.0, procs=[])  # the refused claim is withdrawn: h0's rank 2 still runs
    job = f.engine.fleet.jobs["j"]
    assert job.ranks[2].alive and job.ranks[2].host == "h0"
    f.send("h1", 2.0, procs=[ProcInfo(gpu=0, pid=6, job_id="j", rank=2, world_size=16)])
    assert job.ranks[2].host == "h0"
    f.engine.fleet.disconnected("h0")  # h0 is gone: the waiting claim takes the rank
    assert (job.ranks[2].host, job.ranks[2].pid) == ("h1", 6)
    assert f.engine.fleet.waiting_claims == {}

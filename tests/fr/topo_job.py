"""Real torch.distributed gloo jobs whose ranks run different programs per group, with point-to-point ops.

Run as ``python -m tests.fr.topo_job SCENARIO OUTDIR [--world N] [--culprit RANK]``. Like :mod:`tests.fr.gloo_job`, every rank records
its flight recorder (``TORCH_FR_BUFFER_SIZE``) and a helper thread dumps it (``_dump_fr_trace`` into
OUTDIR/pickle, the JSON variant into OUTDIR/json) when OUTDIR/DUMP appears; the trigger comes, like
PyTorch's watchdog, from any rank that makes no progress for ``STALL_S`` (a rank blocked in a send/recv
counts), or from a rank whose collective failed (a peer that exited closed the connection).

Every rank also writes OUTDIR/meta/ops_rank_<r>.json: its own program order as it ran it — every
collective (group name, seq) and every point-to-point op (group, peer, shape, whether it was posted through
``batch_isend_irecv``, whether it completed before the dump) — because gloo does not record send/recv in the flight recorder. :mod:`tests.fr.p2p_synth` uses
it to write the NCCL-format version (where ProcessGroupNCCL does record them). OUTDIR/expected.json holds
what was injected, written by the job itself (no analyzer involved).

Every scenario takes the culprit as a parameter (any rank; the default, :data:`CULPRIT`, is the one its
recorded set was made with) and the world size where its topology allows (:data:`SIZES`: any even size for
the 2-wide layouts below — stages of 2 dp ranks, pairs, two parity groups —, any size from 2 for the
1-wide pipeline, the ring and early_exit). What follows describes the defaults (:data:`WORLD`).

Scenarios (each a few ranks, a dozen steps):

* ``pp_hang`` (4 ranks): a 2-stage pipeline x 2-way data parallel job. Stage 0 = ranks {0, 1} sends
  activations to its stage-1 partner (r + 2) and receives gradients back; then a dp all_reduce within the
  stage and a world all_reduce. At the fault step rank 3 receives its activation and never sends the
  gradient back: rank 1 blocks in an (unrecorded) recv from 3, rank 2 in the stage-1 all_reduce.
* ``pp_recv_hang`` (4 ranks): the same pipeline; at the fault step rank 0 sends its activation and never
  posts the recv for the gradient: its partner 2 blocks in the send (gloo delivers a send only into a
  posted recv), rank 1 in the stage-0 all_reduce.
* ``pp_healthy`` / ``pp_ondemand`` (4 ranks): the same pipeline without a fault, dumped after its last
  step (a barrier, then rank 0 asks every rank to dump) or on demand by rank 0 four steps before the end
  while the others run (ranks a few ops apart, p2p transfers in flight).
* ``pp4_hang`` (8 ranks): 4 stages x 2-way dp (the same program generalised: activations to rank + 2,
  gradients back to rank - 2). Rank 5 (stage 2) receives its activation and never forwards it: ranks 7,
  3 and 1 block in recvs one behind the other, 0, 2, 4 and 6 in their stage all_reduces.
* ``pp_group_hang`` (4 ranks): ``pp_hang`` with its send/recv over dedicated pipeline groups {0, 2}, {1, 3}
  (``new_group``, used for nothing else: the peers in the op names are local to them).
* ``pp_only_hang`` (4 ranks): 4 pipeline stages of one rank, no data parallelism, a world all_reduce per
  step. Rank 2 never forwards its activation: every rank ends up in a send/recv, none in a collective.
* ``ring_hang`` (4 ranks): every step a ring exchange through ``batch_isend_irecv`` (isend to r+1,
  irecv from r-1: coalesced p2p), then a world all_reduce. Rank 1 never posts its batch at the fault step.
* ``mixed_hang`` (4 ranks): a world all_reduce, then rank 0 feeds ranks 1..3 through batch_isend_irecv
  (p2p counts differ per rank), then tp all_reduce in the pairs {0,1},{2,3}. At the fault step rank 2 never enters
  the tp all_reduce.
* ``subgroup_hang`` (6 ranks): expert groups {0,2,4},{1,3,5} (the parities) all_gather, pair groups
  {0,1},{2,3},{4,5} all_reduce, world all_reduce. Rank 4 never enters its expert all_gather: a cascade through the pairs.
* ``early_exit`` (4 ranks): rank 0 leaves the training loop early and its process exits (no dump); its
  peers' next world all_reduce fails when the connection closes.
* ``compute_stall_dp`` (4 ranks): tp pairs {0,1},{2,3} all_reduce, dp parities {0,2},{1,3} all_gather,
  world all_reduce.
  Rank 2 completes its tp all_reduce and then computes forever before its dp all_gather: rank 0 waits in
  dp, ranks 1 and 3 (done with dp) wait in the world all_reduce for 0 and 2 — the world all_reduce holds
  the most ranks, but rank 2's next collective in its own program order is the dp all_gather.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fr.gloo_job import free_port, mark_started, reap, wait_started

STEPS = 12
FAULT_STEP = 7
STALL_S = 1.5
WORLD = {
    "pp_hang": 4,
    "pp_recv_hang": 4,
    "pp_healthy": 4,
    "pp_ondemand": 4,
    "pp4_hang": 8,
    "pp_group_hang": 4,
    "pp_only_hang": 4,
    "ring_hang": 4,
    "mixed_hang": 4,
    "subgroup_hang": 6,
    "early_exit": 4,
    "compute_stall_dp": 4,
}
#: which world sizes a scenario's topology allows: "even" (2-wide layouts) or "any" (from 2)
SIZES = {
    "pp_hang": "even",
    "pp_recv_hang": "even",
    "pp_healthy": "even",
    "pp_ondemand": "even",
    "pp4_hang": "even",
    "pp_group_hang": "even",
    "pp_only_hang": "any",
    "ring_hang": "any",
    "mixed_hang": "even",
    "subgroup_hang": "even",
    "early_exit": "any",
    "compute_stall_dp": "even",
}
CULPRIT = {
    "pp_hang": 3,
    "pp_recv_hang": 0,
    "pp_healthy": -1,
    "pp_ondemand": -1,
    "pp4_hang": 5,
    "pp_group_hang": 3,
    "pp_only_hang": 2,
    "ring_hang": 1,
    "mixed_hang": 2,
    "subgroup_hang": 4,
    "early_exit": 0,
    "compute_stall_dp": 2,
}


class _Job:
    """One rank's bookkeeping: progress for the watchdog, its program order for the side log."""

    def __init__(self, rank: int, out: Path) -> None:
        self.rank = rank
        self.out = out
        self.progress = time.monotonic()
        self.watch = True
        self.failed = False
        self.ops: list[dict[str, Any]] = []
        self.seq: dict[str, int] = {}
        self.meta: dict[str, Any] = {"rank": rank, "groups": {}}

    def coll(self, group: str, op: str, fn: Callable[[], object]) -> None:
        self.seq[group] = self.seq.get(group, 0) + 1
        rec = {"kind": "coll", "group": group, "seq": self.seq[group], "op": op, "done": False}
        self.ops.append(rec)
        try:
            fn()
        except RuntimeError:
            self.failed = True  # a peer went away: gloo fails the collective (and records it retired)
            raise
        rec["done"] = True
        self.progress = time.monotonic()

    def p2p(
        self,
        group: str,
        works: list[tuple[str, int, list[int]]],
        start: Callable[[], list[Any]],
        coalesced: bool,
    ) -> None:
        """``works``: (send|recv, global peer, shape) of each op, in the order ``start`` issues them;
        ``coalesced``: ``start`` posts them through ``batch_isend_irecv`` (one coalesced batch on NCCL, even
        of one op), else as lone ``isend``/``irecv``."""
        t_ns, batch = time.time_ns(), len(self.ops)  # the ops of one call form one batch
        recs = [
            {
                "kind": kind,
                "group": group,
                "peer": peer,
                "shape": shape,
                "t_ns": t_ns,
                "batch": batch,
                "coalesced": coalesced,
                "done": False,
            }
            for kind, peer, shape in works
        ]
        self.ops.extend(recs)
        for work, rec in zip(start(), recs, strict=True):
            work.wait()
            rec["done"] = True
        self.progress = time.monotonic()

    def write_log(self) -> None:
        (self.out / "meta" / f"ops_rank_{self.rank}.json").write_text(json.dumps(self.ops))
        (self.out / "meta" / f"rank_{self.rank}.json").write_text(json.dumps(self.meta))


def _dumper(job: _Job) -> None:
    import torch

    c10d = torch._C._distributed_c10d
    out = job.out
    trigger = out / "DUMP"
    while True:
        time.sleep(0.02)
        if not trigger.exists():
            if job.failed:
                trigger.write_text(f"collective failed on rank {job.rank}")
            elif job.watch and time.monotonic() - job.progress > STALL_S:
                trigger.write_text(f"watchdog on rank {job.rank}")
            continue
        # torch's _C stubs lack the recorder's dump bindings (they exist at run time)
        pickled = c10d._dump_fr_trace()  # type: ignore[attr-defined]
        as_json = c10d._dump_fr_trace_json()  # type: ignore[attr-defined]
        job.write_log()  # the same instant as the dump: what completed before it
        (out / "pickle" / f"nccl_trace_rank_{job.rank}").write_bytes(pickled)
        (out / "json" / f"nccl_trace_rank_{job.rank}.json").write_bytes(as_json)
        (out / f"dumped_{job.rank}").write_text("1")
        return


def pairs(world: int) -> list[list[int]]:
    """{0, 1}, {2, 3}, ...: the 2-rank groups of the tp/pair layouts."""
    return [[r, r + 1] for r in range(0, world, 2)]


def parities(world: int) -> list[list[int]]:
    """The even and the odd ranks: the dp/expert groups across the pairs."""
    return [list(range(k, world, 2)) for k in (0, 1)]


def worker(rank: int, scenario: str, out: str, port: int, world: int, culprit: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    outdir = Path(out)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    mark_started(outdir, rank)
    name = dist.distributed_c10d._get_process_group_name
    job = _Job(rank, outdir)

    def new_groups(parts: list[list[int]], desc: str) -> Any:
        groups = [dist.new_group(p, group_desc=desc) for p in parts]  # every rank creates every group
        mine = next(g for g, p in zip(groups, parts, strict=True) if rank in p)
        return mine, name(mine)

    def expect(group: str, op: str) -> None:
        fact = {"pg_name": group, "seq": job.seq.get(group, 0) + 1, "op": op, "culprit": culprit}
        (outdir / "expected.json").write_text(json.dumps(fact))

    def gather(gname: str, group: Any, n: int) -> None:
        size = dist.get_world_size(group)
        job.coll(
            gname,
            "all_gather",
            lambda: dist.all_gather_into_tensor(torch.empty(n * size), torch.ones(n), group=group),
        )

    def hang_forever() -> None:
        job.watch = False
        while not (outdir / f"dumped_{rank}").exists():
            time.sleep(0.02)
        time.sleep(30)

    assert dist.group.WORLD is not None  # init_process_group ran
    wname = name(dist.group.WORLD)
    meta = job.meta
    meta.update(world=world, groups={wname: ["default_pg", list(range(world))]})
    threading.Thread(target=_dumper, args=(job,), daemon=True).start()
    healthy = culprit < 0
    # the stall watchdog is armed from the fault step on, and never in healthy runs: a loaded machine must
    # not turn a slow early step into a watchdog dump
    job.watch = False

    def at(step: int) -> None:
        if step == FAULT_STEP and not healthy:
            job.progress = time.monotonic()
            job.watch = True

    if scenario.startswith("pp"):
        # pipeline stages of 2 data-parallel ranks each: stage = rank // 2; activations flow to rank + 2,
        # gradients back to rank - 2; then a dp all_reduce within the stage and a world all_reduce
        width = 1 if scenario == "pp_only_hang" else 2  # data-parallel ranks per stage
        stages = world // width
        stage = rank // width
        parts = [[width * s + d for d in range(width)] for s in range(stages)]
        stage_g, stage_n = new_groups(parts, "dp") if width > 1 else (None, "")
        if width > 1:
            meta["groups"][stage_n] = ["dp", parts[stage]]
        p2p_n, p2p_kw = wname, {}
        if scenario == "pp_group_hang":  # send/recv over a dedicated pipeline group (a p2p-only group)
            chains = [[d + 2 * s for s in range(stages)] for d in (0, 1)]
            pp_g, p2p_n = new_groups(chains, "pp")
            meta["groups"][p2p_n] = ["pp", chains[rank % 2]]
            p2p_kw = {"group": pp_g}
        program = [("recv", rank - width)] if stage > 0 else []
        program += [("send", rank + width), ("recv", rank + width)] if stage < stages - 1 else []
        program += [("send", rank - width)] if stage > 0 else []
        post = {"send": dist.isend, "recv": dist.irecv}
        for step in range(STEPS):
            at(step)
            if scenario == "pp_ondemand" and rank == 0 and step == STEPS - 4:
                (outdir / "DUMP").write_text("on demand")
            for i, (kind, peer) in enumerate(program):
                if rank == culprit and step == FAULT_STEP and i == 1:  # the culprit stops before its 2nd op
                    never = {"send": "p2p_never_sent", "recv": "p2p_never_received"}[kind]
                    fact = {"culprit": culprit, "kind": never, "op": kind, "peer": peer}
                    (outdir / "expected.json").write_text(json.dumps(fact))
                    hang_forever()

                def post_one(k: str = kind, q: int = peer) -> list[Any]:
                    return [post[k](torch.ones(64), q, **p2p_kw)]

                job.p2p(p2p_n, [(kind, peer, [64])], post_one, coalesced=False)
            if width > 1:
                job.coll(stage_n, "all_reduce", lambda: dist.all_reduce(torch.ones(256), group=stage_g))
            job.coll(wname, "all_reduce", lambda: dist.all_reduce(torch.ones(128)))
    elif scenario == "ring_hang":
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for step in range(STEPS):
            at(step)
            if rank == culprit and step == FAULT_STEP:
                fact = {"culprit": culprit, "kind": "p2p_never_posted", "op": "batch_isend_irecv"}
                (outdir / "expected.json").write_text(json.dumps(fact))
                hang_forever()
            out_t, in_t = torch.ones(48), torch.empty(48)

            def ring(o: torch.Tensor = out_t, i: torch.Tensor = in_t) -> list[Any]:
                return dist.batch_isend_irecv(
                    [dist.P2POp(dist.isend, o, nxt), dist.P2POp(dist.irecv, i, prv)]
                )

            job.p2p(wname, [("send", nxt, [48]), ("recv", prv, [48])], ring, coalesced=True)
            job.coll(wname, "all_reduce", lambda: dist.all_reduce(torch.ones(128)))
    elif scenario == "mixed_hang":
        tp_g, tp_n = new_groups(pairs(world), "tp")
        meta["groups"][tp_n] = ["tp", pairs(world)[rank // 2]]
        for step in range(STEPS):
            at(step)
            job.coll(wname, "all_reduce", lambda: dist.all_reduce(torch.ones(512)))
            if rank == 0:
                bufs = [torch.full((32,), float(p)) for p in range(1, world)]

                def send_all(bufs: list[torch.Tensor] = bufs) -> list[Any]:
                    ops = [dist.P2POp(dist.isend, b, p) for p, b in zip(range(1, world), bufs, strict=True)]
                    return dist.batch_isend_irecv(ops)

                job.p2p(wname, [("send", p, [32]) for p in range(1, world)], send_all, coalesced=True)
            else:
                buf = torch.empty(32)

                def recv_one(buf: torch.Tensor = buf) -> list[Any]:
                    return dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 0)])

                job.p2p(wname, [("recv", 0, [32])], recv_one, coalesced=True)
            if rank == culprit and step == FAULT_STEP:
                expect(tp_n, "all_reduce")
                hang_forever()
            job.coll(tp_n, "all_reduce", lambda: dist.all_reduce(torch.ones(256), group=tp_g))
    elif scenario == "subgroup_hang":
        ex_g, ex_n = new_groups(parities(world), "expert")
        pair_g, pair_n = new_groups(pairs(world), "pair")
        meta["groups"][ex_n] = ["expert", parities(world)[rank % 2]]
        meta["groups"][pair_n] = ["pair", pairs(world)[rank // 2]]
        for step in range(STEPS):
            at(step)
            if rank == culprit and step == FAULT_STEP:
                expect(ex_n, "all_gather")
                hang_forever()
            gather(ex_n, ex_g, 16)
            job.coll(pair_n, "all_reduce", lambda: dist.all_reduce(torch.ones(96), group=pair_g))
            job.coll(wname, "all_reduce", lambda: dist.all_reduce(torch.ones(64)))
    elif scenario == "early_exit":
        for step in range(STEPS):
            at(step)
            if rank == culprit and step == FAULT_STEP:
                expect(wname, "all_reduce")
                job.write_log()
                (outdir / f"exited_{rank}").write_text("1")
                os._exit(0)  # leaves the loop and the process: no dump, connections close
            try:
                job.coll(wname, "all_reduce", lambda: dist.all_reduce(torch.ones(256)))

                def broadcast(step: int = step) -> object:
                    return dist.broadcast(torch.ones(64), src=step % world)

                job.coll(wname, "broadcast", broadcast)
            except RuntimeError:
                hang_forever()
    elif scenario == "compute_stall_dp":
        tp_g, tp_n = new_groups(pairs(world), "tp")
        dp_g, dp_n = new_groups(parities(world), "dp")
        meta["groups"][tp_n] = ["tp", pairs(world)[rank // 2]]
        meta["groups"][dp_n] = ["dp", parities(world)[rank % 2]]
        for step in range(STEPS):
            at(step)
            job.coll(tp_n, "all_reduce", lambda: dist.all_reduce(torch.ones(256), group=tp_g))
            if rank == culprit and step == FAULT_STEP:
                expect(dp_n, "all_gather")
                hang_forever()
            gather(dp_n, dp_g, 32)
            job.coll(wname, "all_reduce", lambda: dist.all_reduce(torch.ones(128)))
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if not healthy:
        hang_forever()  # a rank that got through waits for the dump its stuck peers trigger
    (outdir / "expected.json").write_text(json.dumps({"culprit": -1}))
    dist.barrier()
    if scenario == "pp_healthy" and rank == 0:
        (outdir / "DUMP").write_text("end of run")
    while not (outdir / f"dumped_{rank}").exists():
        time.sleep(0.02)
    dist.barrier()
    dist.destroy_process_group()


def run(
    scenario: str,
    out: Path,
    timeout_s: float = 60.0,
    world: int | None = None,
    culprit: int | None = None,
) -> dict[str, Any]:
    """Run the job until every rank dumped (or exited); returns expected.json's content.

    ``world`` / ``culprit`` default to the scenario's :data:`WORLD` / :data:`CULPRIT` (the recorded sets);
    a world its topology does not allow (:data:`SIZES`) or a culprit outside it is refused.
    """
    import multiprocessing as mp

    world = WORLD[scenario] if world is None else world
    culprit = CULPRIT[scenario] if culprit is None else culprit
    if world < 2 or (SIZES[scenario] == "even" and (world < 4 or world % 2)):
        raise ValueError(f"{scenario}: world {world} (its layout needs {SIZES[scenario]} sizes)")
    if CULPRIT[scenario] >= 0 and not 0 <= culprit < world:
        raise ValueError(f"{scenario}: culprit {culprit} is no rank of a world of {world}")
    if CULPRIT[scenario] < 0:
        culprit = -1  # a healthy scenario injects nothing
    for sub in ("pickle", "json", "meta"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(r, scenario, str(out), port, world, culprit), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        wait_started(out, procs)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            over = [(out / f"dumped_{r}").exists() or (out / f"exited_{r}").exists() for r in range(world)]
            if all(over):
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(f"{scenario}: not every rank dumped within {timeout_s} s of starting")
    finally:
        reap(procs)
    return dict(json.loads((out / "expected.json").read_text()))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fr.topo_job")
    parser.add_argument("scenario", choices=sorted(WORLD))
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--world", type=int, default=None)
    parser.add_argument("--culprit", type=int, default=None)
    args = parser.parse_args(argv)
    print(run(args.scenario, args.outdir, world=args.world, culprit=args.culprit))


if __name__ == "__main__":
    main(sys.argv[1:])

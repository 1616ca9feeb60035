"""A small real torch.distributed gloo job that writes Flight Recorder dumps, with an injected fault.

Run as ``python -m tests.fr.gloo_job SCENARIO WORLD OUTDIR [STEPS] [--culprit RANK]``. Every rank records its flight recorder
(TORCH_FR_BUFFER_SIZE) and a helper thread dumps it (``_dump_fr_trace`` into OUTDIR/pickle, the JSON variant
into OUTDIR/json) when OUTDIR/DUMP appears. The trigger comes, like PyTorch's watchdog, from any rank that
sees no progress for STALL_S, or on demand from rank 0 (ondemand), or after the last step (healthy); the
straggler scenario dumps at a synchronised moment instead (:func:`_straggler_dump`).
OUTDIR/meta/rank_<r>.json holds each rank's process groups (name -> [desc, member ranks], as
:mod:`tests.fr.topo_job` writes them), from which :mod:`tests.fr.nccl_synth` gives the NCCL-format version.
OUTDIR/expected.json records, counted by this script independently of any analyzer, what was injected:
``culprit`` (-1 in a healthy run), ``kind``, and the collective (``pg_name``, ``seq``, ``op``) where the
fault sits in one.

WORLD is any even size (tp = the two halves of the world, dp = the pairs ``{j, j + WORLD/2}``); the culprit
is any rank (``--culprit``, default :data:`CULPRIT`: the values the recorded sets were made with).
Scenarios (default culprits): healthy, hang (rank 3 never enters its tp all_reduce: a cascade through dp),
straggler (rank 1 enters every collective late; dumped on demand mid-run, while its peers wait for it in a
collective), op_mismatch (rank 3 calls broadcast where the others call the world all_reduce), ondemand (a
healthy job dumped on demand by rank 0 while it runs: ranks are caught up to a collective apart),
bcast_size (rank 2 broadcasts twice the elements its peers expect: gloo's transport aborts a receiving
rank, which leaves no dump), hang_world (rank 3 never enters a world all_reduce: every peer waits in
that one), size_crash (rank 3 passes half the elements to a world all_reduce: gloo's transport aborts the
culprit itself, whose dump is missing; its peers' all_reduce fails and they dump on the exception),
straggler_async (the straggler, dumped on demand by rank 0 four steps before the end while the job runs,
each rank whenever its thread sees the request: the way the shared corpus's straggler set was taken,
with the skew that brings — see :func:`_straggler_dump`). With
STEPS above ~500 every rank's 2,000-entry ring buffer wraps (the fault
comes 8 steps before the end): full-buffer dumps with stack frames, as a long job leaves them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

STEPS = 14


def pg_timeout_s(world: int) -> int:
    """gloo's collective timeout: a world of dozens of ranks on two cores takes tens of seconds to write
    every rank's dump (the straggler scenario's peers wait inside a collective meanwhile), so it grows
    with the world; whoever waits for the job waits longer than this."""
    return 60 + 2 * world


FAULT_STEP = 6
STALL_S = 1.0
#: starting the ranks (spawn, import torch, the gloo rendezvous) takes a few seconds on a quiet machine and
#: over a minute on a loaded 2-core one: it is waited for on its own, with this generous bound, and the
#: job's own timeout counts from when every rank has joined
STARTUP_S = 300.0
STRAGGLE_S = 0.03
CULPRIT = {
    "hang": 3,
    "straggler": 1,
    "straggler_async": 1,
    "op_mismatch": 3,
    "healthy": -1,
    "ondemand": -1,
    "bcast_size": 2,
    "hang_world": 3,
    "size_crash": 3,
}
STRAGGLERS = ("straggler", "straggler_async")
#: scenarios in which a rank is meant to die (gloo's transport aborts it): no failure of the job
ABORTS = ("bcast_size", "size_crash")


def _dumper(rank: int, out: Path, state: dict[str, float]) -> None:
    trigger = out / "DUMP"
    injected = out / "expected.json"
    while True:
        time.sleep(0.02)
        if not trigger.exists():
            if state["watch"] and not state["armed_at"] and injected.exists():
                state["armed_at"] = time.monotonic()
            # a stall counts from the fault on: a peer slowed by a loaded machine before it is no hang
            since = max(state["progress"], state["armed_at"])
            if state["armed_at"] and state["watch"] and time.monotonic() - since > STALL_S:
                trigger.write_text(f"watchdog on rank {rank}")
            continue
        dump(rank, out)
        return


def dump(rank: int, out: Path) -> None:
    """Write this rank's flight recorder, pickle and JSON, and mark it dumped."""
    import torch

    c10d = torch._C._distributed_c10d
    # torch's _C stubs lack the recorder's dump bindings (they exist at run time)
    (out / "pickle" / f"nccl_trace_rank_{rank}").write_bytes(c10d._dump_fr_trace())  # type: ignore[attr-defined]
    (out / "json" / f"nccl_trace_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json())  # type: ignore[attr-defined]
    (out / f"dumped_{rank}").write_text("1")


def _straggler_dump(rank: int, world: int, out: Path, culprit: int) -> None:
    """The straggler scenario's on-demand dump, taken where a straggler's dumps are unambiguous whatever the
    machine's load: every other rank has entered the world all_reduce (recorded, async) and dumps inside
    it; the straggler, late as before every collective, dumps only once they all have, and then enters.

    Dumps triggered by a file and taken by each rank's polling thread whenever it ran left the moment to the
    scheduler: on a loaded machine a fast rank's dump could predate its entering a collective that the
    straggler's (late) dump was already inside — dumps that show the fast rank missing from a collective its
    peer waits in, which no analysis can tell from a hang (it happened once in a test run).
    """
    import torch
    import torch.distributed as dist

    if rank == culprit:
        others = [r for r in range(world) if r != rank]
        while not all((out / f"dumped_{r}").exists() for r in others):
            time.sleep(0.01)
        dump(rank, out)
        dist.all_reduce(torch.ones(1024))
        return
    work = dist.all_reduce(torch.ones(1024), async_op=True)
    dump(rank, out)
    work.wait()


def worker(
    rank: int, world: int, scenario: str, out: str, port: int, steps: int = STEPS, culprit: int | None = None
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    outdir = Path(out)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=pg_timeout_s(world))
    )
    half = world // 2
    tp_ranks = [list(range(i * half, (i + 1) * half)) for i in range(2)]
    dp_ranks = [[j, j + half] for j in range(half)]
    tp_groups = [dist.new_group(ranks, group_desc="tp") for ranks in tp_ranks]
    dp_groups = [dist.new_group(ranks, group_desc="dp") for ranks in dp_ranks]
    tp = tp_groups[rank // half]
    dp = dp_groups[rank % half]
    culprit = CULPRIT[scenario] if culprit is None else culprit
    fault_step = FAULT_STEP if steps == STEPS else steps - 8
    # only faulty runs watch for a stall, and only once the fault is injected (its expected.json written): a
    # loaded CI machine must not turn a slow step into a watchdog dump
    state = {
        "progress": time.monotonic(),
        "watch": 1.0 if scenario in ("hang", "op_mismatch", "hang_world", *ABORTS) else 0.0,
        "armed_at": 0.0,
    }
    thread = threading.Thread(target=_dumper, args=(rank, outdir, state), daemon=True)
    thread.start()
    mark_started(outdir, rank)
    seq = {"world": 0, "tp": 0, "dp": 0}
    assert dist.group.WORLD is not None  # init_process_group ran
    names = {
        "world": dist.distributed_c10d._get_process_group_name(dist.group.WORLD),
        "tp": dist.distributed_c10d._get_process_group_name(tp),
        "dp": dist.distributed_c10d._get_process_group_name(dp),
    }
    members = {"world": list(range(world)), "tp": tp_ranks[rank // half], "dp": dp_ranks[rank % half]}
    desc = {"world": "default_pg", "tp": "tp", "dp": "dp"}
    groups = {names[k]: [desc[k], members[k]] for k in names}
    (outdir / "meta" / f"rank_{rank}.json").write_text(json.dumps({"rank": rank, "groups": groups}))
    expected: dict[str, object] = {}

    def record(fact: dict[str, object]) -> None:
        # written once the fault is injected: its existence also arms the peers' stall watchdog
        (outdir / "expected.json").write_text(json.dumps({"culprit": culprit, "kind": scenario, **fact}))

    def coll(group: str, fn: object) -> None:
        if scenario in STRAGGLERS and rank == culprit:
            time.sleep(STRAGGLE_S)
        seq[group] += 1
        fn()  # type: ignore[operator]
        state["progress"] = time.monotonic()

    def hang_forever(watch: bool = False) -> None:
        """Stop here until the dump. ``watch``: as a rank that ran on into its next collective, whose peers
        are gone, would: its stall watchdog stays armed (a rank that hangs on purpose disarms it)."""
        if not watch:
            state["watch"] = 0.0
        while not (outdir / f"dumped_{rank}").exists():
            time.sleep(0.02)
        time.sleep(30)

    if scenario in STRAGGLERS and rank == culprit:
        record({"straggle_ms": STRAGGLE_S * 1e3})  # (no watchdog in this scenario to arm)
    for step in range(steps):
        if scenario in ("ondemand", "straggler_async") and rank == 0 and step == steps - 4:
            if scenario == "ondemand":
                record({"culprit": -1})
            (outdir / "DUMP").write_text("on demand")
        if scenario == "hang" and rank == culprit and step == fault_step:
            expected = {"pg_name": names["tp"], "seq": seq["tp"] + 1, "op": "all_reduce"}
            record(expected)
            hang_forever()
        coll("tp", lambda: dist.all_reduce(torch.ones(256), group=tp))
        g = torch.ones(64)
        coll("dp", lambda g=g: dist.all_gather_into_tensor(torch.empty(128), g, group=dp))
        if scenario == "op_mismatch" and rank == culprit and step == fault_step:
            expected = {"pg_name": names["world"], "seq": seq["world"] + 1, "op": "broadcast"}
            record(expected)
            with contextlib.suppress(Exception):
                coll("world", lambda: dist.broadcast(torch.ones(1024), src=0))
            hang_forever()
        if scenario == "bcast_size" and step == fault_step:
            if rank == culprit:
                expected = {"pg_name": names["world"], "seq": seq["world"] + 1, "op": "broadcast"}
                record(expected)
            n = 2048 if rank == culprit else 1024
            try:
                coll("world", lambda n=n: dist.broadcast(torch.ones(n), src=culprit))
            except RuntimeError:  # gloo failed it (a peer aborted): PyTorch dumps on the exception
                (outdir / "DUMP").write_text(f"collective failed on rank {rank}")
            # every receiver may abort (a small world, the culprit at the root): the sender then stalls
            hang_forever(watch=True)
        if scenario in ("hang_world", "size_crash") and rank == culprit and step == fault_step:
            record({"pg_name": names["world"], "seq": seq["world"] + 1, "op": "all_reduce"})
            if scenario == "hang_world":
                hang_forever()
        if scenario == "size_crash" and step == fault_step:
            n = 512 if rank == culprit else 1024
            try:
                coll("world", lambda n=n: dist.all_reduce(torch.ones(n)))
            except RuntimeError:  # the culprit aborted: PyTorch dumps on the exception
                (outdir / "DUMP").write_text(f"collective failed on rank {rank}")
            hang_forever(watch=True)
        if scenario == "straggler" and step == steps - 4:
            coll("world", lambda: _straggler_dump(rank, world, outdir, culprit))
        else:
            coll("world", lambda: dist.all_reduce(torch.ones(1024)))
        coll("world", lambda step=step: dist.broadcast(torch.ones(128), src=step % world))
    state["watch"] = 0.0
    dist.barrier()
    if scenario == "healthy" and rank == 0:
        record({"culprit": -1})
        (outdir / "DUMP").write_text("end of run")
    while not (outdir / f"dumped_{rank}").exists():
        time.sleep(0.02)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mark_started(out: Path, rank: int) -> None:
    """This rank has imported torch and joined its process groups (see :func:`wait_started`)."""
    (out / f"started_{rank}").write_text("1")


def wait_started(out: Path, procs: list[Any], startup_s: float = STARTUP_S) -> float:
    """Wait until every rank has called :func:`mark_started` (at most ``startup_s``); the time it took.

    A rank that exits first fails at once. Only this phase is slow under load; it is bounded apart from the
    job so that the job's own timeout does not have to cover a minute of imports.
    """
    started = time.monotonic()
    while not all((out / f"started_{r}").exists() for r in range(len(procs))):
        if any(p.exitcode is not None for p in procs):
            raise RuntimeError(f"a rank exited while starting: exit codes {[p.exitcode for p in procs]}")
        if time.monotonic() - started > startup_s:
            raise TimeoutError(f"not every rank imported torch and joined within {startup_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


def reap(procs: list[Any]) -> None:
    """Kill the job's rank processes still alive (hung ranks never exit) and wait for each."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5)


def run(
    scenario: str,
    world: int,
    out: Path,
    timeout_s: float = 40.0,
    steps: int = STEPS,
    culprit: int | None = None,
) -> dict[str, object]:
    """Run the job; returns expected.json's content once every rank dumped.

    ``culprit``: the rank the fault is injected into (default :data:`CULPRIT`'s for the scenario).
    """
    import multiprocessing as mp

    if world < 2 or world % 2:
        raise ValueError(f"world {world}: the job's tp halves and dp pairs need an even world")
    if culprit is not None and not 0 <= culprit < world:
        raise ValueError(f"culprit {culprit} is no rank of a world of {world}")

    for sub in ("pickle", "json", "meta"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(r, world, scenario, str(out), port, steps, culprit), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        wait_started(out, procs)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dumped = [(out / f"dumped_{r}").exists() for r in range(world)]
            if any(dumped) and all(d or p.exitcode is not None for d, p in zip(dumped, procs, strict=True)):
                break
            if scenario not in ABORTS and any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
            time.sleep(0.05)
        else:
            raise TimeoutError(f"{scenario}: not every rank dumped within {timeout_s} s of starting")
        if scenario in ("healthy", "ondemand", *STRAGGLERS):
            for p in procs:
                p.join(max(0.1, deadline - time.monotonic()))
    finally:
        reap(procs)
    path = out / "expected.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fr.gloo_job")
    parser.add_argument("scenario", choices=sorted(CULPRIT))
    parser.add_argument("world", type=int)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("steps", type=int, nargs="?", default=STEPS)
    parser.add_argument("--culprit", type=int, default=None)
    args = parser.parse_args(argv)
    steps = args.steps
    timeout_s = 60 + steps * 0.5
    print(run(args.scenario, args.world, args.outdir, timeout_s=timeout_s, steps=steps, culprit=args.culprit))


if __name__ == "__main__":
    main(sys.argv[1:])

"""A small real torch.distributed gloo job that writes Flight Recorder dumps, with an injected fault.

Run as ``python -m tests.fr.gloo_job SCENARIO WORLD OUTDIR [STEPS]``. Every rank records its flight recorder
(TORCH_FR_BUFFER_SIZE) and a helper thread dumps it (``_dump_fr_trace`` into OUTDIR/pickle, the JSON variant
into OUTDIR/json) when OUTDIR/DUMP appears. The trigger comes, like PyTorch's watchdog, from any rank that
sees no progress for STALL_S, or on demand from rank 0 (ondemand), or after the last step (healthy); the
straggler scenario dumps at a synchronised moment instead (:func:`_straggler_dump`).
OUTDIR/expected.json records, counted by this script independently of any analyzer, what was injected.

Scenarios: healthy, hang (rank 3 never enters its tp all_reduce: a cascade through dp), straggler (rank 1
enters every collective late; dumped on demand mid-run, while its peers wait for it in a collective),
op_mismatch (rank 3 calls broadcast where the others call the world all_reduce), ondemand (a healthy job
dumped on demand by rank 0 while it runs: ranks are caught up to a collective apart), bcast_size (rank 2
broadcasts twice the elements its peers expect: gloo's transport aborts a receiving rank, which leaves no
dump). With STEPS above ~500 every rank's 2,000-entry ring buffer wraps (the fault
comes 8 steps before the end): full-buffer dumps with stack frames, as a long job leaves them.
"""

from __future__ import annotations

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
FAULT_STEP = 6
STALL_S = 1.0
#: starting the ranks (spawn, import torch, the gloo rendezvous) takes a few seconds on a quiet machine and
#: over a minute on a loaded 2-core one: it is waited for on its own, with this generous bound, and the
#: job's own timeout counts from when every rank has joined
STARTUP_S = 300.0
STRAGGLE_S = 0.03
CULPRIT = {"hang": 3, "straggler": 1, "op_mismatch": 3, "healthy": -1, "ondemand": -1, "bcast_size": 2}


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


def worker(rank: int, world: int, scenario: str, out: str, port: int, steps: int = STEPS) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    outdir = Path(out)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    half = world // 2
    tp_groups = [dist.new_group(list(range(i * half, (i + 1) * half)), group_desc="tp") for i in range(2)]
    dp_groups = [dist.new_group([j, j + half], group_desc="dp") for j in range(half)]
    tp = tp_groups[rank // half]
    dp = dp_groups[rank % half]
    culprit = CULPRIT[scenario]
    fault_step = FAULT_STEP if steps == STEPS else steps - 8
    # only faulty runs watch for a stall, and only once the fault is injected (its expected.json written): a
    # loaded CI machine must not turn a slow step into a watchdog dump
    state = {
        "progress": time.monotonic(),
        "watch": 1.0 if scenario in ("hang", "op_mismatch", "bcast_size") else 0.0,
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
    expected: dict[str, object] = {}

    def coll(group: str, fn: object) -> None:
        if scenario == "straggler" and rank == culprit:
            time.sleep(STRAGGLE_S)
        seq[group] += 1
        fn()  # type: ignore[operator]
        state["progress"] = time.monotonic()

    def hang_forever() -> None:
        state["watch"] = 0.0
        while not (outdir / f"dumped_{rank}").exists():
            time.sleep(0.02)
        time.sleep(30)

    for step in range(steps):
        if scenario == "ondemand" and rank == 0 and step == steps - 4:
            (outdir / "DUMP").write_text("on demand")
        if scenario == "hang" and rank == culprit and step == fault_step:
            expected = {"pg_name": names["tp"], "seq": seq["tp"] + 1, "op": "all_reduce"}
            (outdir / "expected.json").write_text(json.dumps(expected))
            hang_forever()
        coll("tp", lambda: dist.all_reduce(torch.ones(256), group=tp))
        g = torch.ones(64)
        coll("dp", lambda g=g: dist.all_gather_into_tensor(torch.empty(128), g, group=dp))
        if scenario == "op_mismatch" and rank == culprit and step == fault_step:
            expected = {"pg_name": names["world"], "seq": seq["world"] + 1, "op": "broadcast"}
            (outdir / "expected.json").write_text(json.dumps(expected))
            with contextlib.suppress(Exception):
                coll("world", lambda: dist.broadcast(torch.ones(1024), src=0))
            hang_forever()
        if scenario == "bcast_size" and step == fault_step:
            if rank == culprit:
                expected = {"pg_name": names["world"], "seq": seq["world"] + 1, "op": "broadcast"}
                (outdir / "expected.json").write_text(json.dumps(expected))
            n = 2048 if rank == culprit else 1024
            with contextlib.suppress(Exception):
                coll("world", lambda n=n: dist.broadcast(torch.ones(n), src=culprit))
            hang_forever()
        if scenario == "straggler" and step == steps - 4:
            coll("world", lambda: _straggler_dump(rank, world, outdir, culprit))
        else:
            coll("world", lambda: dist.all_reduce(torch.ones(1024)))
        coll("world", lambda step=step: dist.broadcast(torch.ones(128), src=step % world))
    state["watch"] = 0.0
    dist.barrier()
    if scenario == "healthy" and rank == 0:
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
    scenario: str, world: int, out: Path, timeout_s: float = 40.0, steps: int = STEPS
) -> dict[str, object]:
    """Run the job; returns expected.json's content (empty for healthy/straggler) once every rank dumped."""
    import multiprocessing as mp

    (out / "pickle").mkdir(parents=True, exist_ok=True)
    (out / "json").mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=worker, args=(r, world, scenario, str(out), port, steps), daemon=True)
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
            if scenario != "bcast_size" and any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
            time.sleep(0.05)
        else:
            raise TimeoutError(f"{scenario}: not every rank dumped within {timeout_s} s of starting")
        if scenario in ("healthy", "straggler", "ondemand"):
            for p in procs:
                p.join(max(0.1, deadline - time.monotonic()))
    finally:
        reap(procs)
    path = out / "expected.json"
    return json.loads(path.read_text()) if path.exists() else {}


if __name__ == "__main__":
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else STEPS
    print(run(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), timeout_s=60 + steps * 0.5, steps=steps))

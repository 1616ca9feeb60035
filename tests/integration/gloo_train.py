"""A real torch.distributed gloo training job for the end-to-end tests: N CPU ranks with the sentinel probe.

Run as ``python -m tests.integration.gloo_train SPEC.json``. The spec names the job, the rendezvous port, a
control folder and, per rank, its environment (LOCAL_RANK's host: SENTINEL_PROBE_SOCKET,
TORCH_NCCL_DEBUG_INFO_PIPE_FILE, TORCH_FR_DUMP_TEMP_FILE). The launcher imports torch once and forks the
ranks — a fresh interpreter per rank spends ~1.5 s of CPU importing torch, more than 10 s for 8 ranks on a
2-core machine — and each rank gets the environment a launcher (torchrun, Slurm) would give it before it
touches torch.distributed: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, SENTINEL_JOB_ID.

Each step: all_reduce of a gradient, then all_reduce of a stop flag (rank 0 raises it when CONTROL/stop
exists, so every rank leaves at the same step and the run ends cleanly). A rank named in CONTROL/hang stops
before its next gradient all_reduce (it writes CONTROL/hung_<rank> with the time) and sleeps forever, while
its probe thread keeps reporting and its peers block inside the all_reduce. A rank whose spec names ``netns`` (a
path such as /run/netns/x) enters that network namespace first, so ranks run on separate "hosts" joined by
real links; the job's ``master_addr`` and ``grad_elems`` (the gradient's size) then apply. CONTROL/slow holding ``RANK
SECONDS`` makes that rank a straggler: each of its steps computes SECONDS longer (a sleep in its compute
phase, between its flag all_reduce and its next gradient all_reduce, where a slow GPU, input pipeline or host
spends its time; a sleep rather than busy work, which on a 2-core machine would slow every rank alike). The
file is read each step, so the slow rank can change or stop (an empty file, or CONTROL/slow removed) while the
job runs.

Dumps on request: ProcessGroupNCCL polls the FIFO ``$TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe`` and
dumps its flight recorder when something is written into it; the CPU build of torch (gloo only) has no such
watcher, so each rank runs a small one that does the same: create the FIFO, poll it, and on a write save
``_dump_fr_trace(includeStackTraces=False)`` to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (written to a temporary
name, then renamed; stack traces are left out because symbolizing them costs ~1 s of CPU per rank here).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000


def _die_with_parent(parent: int) -> None:
    """A rank must not outlive its launcher (a killed test leaves no orphans)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _dump_pipe_watcher(rank: int) -> None:
    """Stand-in for ProcessGroupNCCL's DumpPipe on gloo: a write into the FIFO dumps the flight recorder."""
    import torch

    pipe_prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
    out_prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
    if not pipe_prefix or not out_prefix:
        return
    pipe = f"{pipe_prefix}{rank}.pipe"
    with contextlib.suppress(FileExistsError):
        os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    out = Path(f"{out_prefix}{rank}")
    while True:
        time.sleep(0.05)
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            data = b""
        if not data:
            continue
        # without stack traces: symbolizing them takes seconds of CPU per rank (and holds the GIL)
        # torch's _C stubs lack the recorder's dump binding (it exists at run time)
        blob = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False)  # type: ignore[attr-defined]
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, out)


def _extra_compute_s(control: Path, rank: int) -> float:
    """Seconds this rank's step computes longer (CONTROL/slow names ``RANK SECONDS``; 0 when it names
    another rank, is empty or absent: the test writes it while the ranks read it)."""
    try:
        fields = (control / "slow").read_text().split()
    except FileNotFoundError:
        return 0.0
    if len(fields) != 2 or fields[0] != str(rank):
        return 0.0
    try:
        return max(0.0, float(fields[1]))
    except ValueError:
        return 0.0


def _enter_netns(path: str) -> None:
    """Move this (forked, not yet networked) rank into the network namespace at ``path``: its "host"."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def run_rank(spec: dict[str, Any], job: dict[str, Any]) -> int:
    rank = int(spec["rank"])
    if spec.get("netns"):
        _enter_netns(spec["netns"])
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(spec["local_rank"]),
            "WORLD_SIZE": str(job.get("world_size", len(job["ranks"]))),  # one node's share of a bigger job
            "MASTER_ADDR": job.get("master_addr", "127.0.0.1"),
            "MASTER_PORT": str(job["port"]),
            "SENTINEL_JOB_ID": job["job_id"],
            **spec["env"],
        }
    )
    import torch
    import torch.distributed as dist

    import sentinel.probe

    control = Path(job["control"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    sentinel.probe.start(interval_s=float(job.get("probe_interval_s", 1.0)))
    threading.Thread(target=_dump_pipe_watcher, args=(rank,), daemon=True).start()
    grad = torch.ones(int(job.get("grad_elems", 4096)))
    step_s = float(job.get("step_s", 0.05))
    step = 0
    while True:
        hang = control / "hang"
        if hang.exists() and hang.read_text().strip() == str(rank):
            (control / f"hung_{rank}").write_text(repr(time.time()))
            while True:
                time.sleep(1.0)
        grad.fill_(1.0)
        dist.all_reduce(grad)
        flag = torch.tensor([1.0 if rank == 0 and (control / "stop").exists() else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        step += 1
        time.sleep(step_s + _extra_compute_s(control, rank))
    (control / f"done_{rank}").write_text(str(step))
    dist.destroy_process_group()
    return 0


def main(spec_path: str) -> int:
    job = json.loads(Path(spec_path).read_text())
    import torch.distributed  # noqa: F401 - imported once here, shared by the forked ranks

    launcher = os.getpid()
    pids: list[int] = []
    for spec in job["ranks"]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _die_with_parent(launcher)
                code = run_rank(spec, job)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    (Path(job["control"]) / "pids").write_text(json.dumps(pids))
    worst = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        worst = max(worst, abs(os.waitstatus_to_exitcode(status)))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""GPU → process → job/rank, from each GPU process's environment, its Slurm cgroup, ``scontrol listpids``.

Launchers leave the job identity in the environment of every rank: Slurm (SLURM_JOB_ID, SLURM_PROCID),
torchrun (TORCHELASTIC_RUN_ID, RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or an explicit
SENTINEL_JOB_ID; that stays the first choice. Reading another user's /proc/<pid>/environ needs privileges
(and a hardened agent has none), so when the environment is refused or names no job, a Slurm task is known by
its cgroup instead — ``/proc/<pid>/cgroup`` is readable by anyone and slurmstepd puts every task in
``.../job_<id>/step_<step>/task_<local id>`` (cgroup v1 and v2 layouts, :func:`slurm_from_cgroup`) — and its
global rank from ``scontrol listpids`` (:func:`parse_listpids`) where the command is there. A process still
unknown is reported (pid and name) without job fields, and the refusal is counted. Results are cached per
(pid, create time), so a long-running rank costs one read, not one per poll.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import psutil

from sentinel.components.nccl_debug.record import DebugReadiness
from sentinel.components.nccl_debug.rule import assess, pattern_is_tailed
from sentinel.log import get_logger
from sentinel.wire import ProcInfo

log = get_logger(module="agent.jobs")

MAX_CACHE = 4096
MAX_CGROUP_BYTES = 64 * 1024
MAX_LISTPIDS_BYTES = 4 * 1024 * 1024
LISTPIDS_TIMEOUT_S = 5.0
#: a Slurm task's place in the cgroup tree: v1 ``/slurm[_node]/uid_U/job_J/step_S/task_T``,
#: v2 ``/system.slice/[node_]slurmstepd.scope/job_J/step_S/user/task_T`` (the step's own processes,
#: slurmstepd itself, live in ``step_S/slurm``)
_CGROUP_JOB = re.compile(
    r"/job_(\d{1,18})(?:/step_([A-Za-z0-9_]{1,32}))?(?:/user)?(?:/task_(\d{1,9}))?(?=/|$)"
)


@dataclass(frozen=True)
class SlurmTask:
    """Where a process sits in Slurm: job, step (``0``, ``batch``, ``extern``...), local task id, rank."""

    job_id: str
    step: str | None = None
    local_id: int | None = None
    global_id: int | None = None


def slurm_from_cgroup(text: str) -> SlurmTask | None:
    """The Slurm job/step/task of a process from its ``/proc/<pid>/cgroup`` text, or None outside Slurm.

    Every hierarchy line is looked at (v1 has one per controller, v2 one ``0::`` line); the most specific
    match wins (one naming the task over one naming only the job).
    """
    best: SlurmTask | None = None
    for line in text[:MAX_CGROUP_BYTES].splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        for m in _CGROUP_JOB.finditer(path):
            task = SlurmTask(job_id=m.group(1), step=m.group(2), local_id=_int(m.group(3)))
            score = (task.local_id is not None, task.step is not None)
            if best is None or score > (best.local_id is not None, best.step is not None):
                best = task
    return best


def parse_listpids(text: str) -> dict[int, SlurmTask]:
    """``scontrol listpids`` output (``PID JOBID STEPID LOCALID GLOBALID``, ``-`` when none) by pid."""
    out: dict[int, SlurmTask] = {}
    for line in text[:MAX_LISTPIDS_BYTES].splitlines():
        parts = line.split()
        if len(parts) != 5 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        pid = _int(parts[0])
        if pid is None or len(parts[1]) > 18:
            continue
        step = parts[2] if parts[2] != "-" and len(parts[2]) <= 32 else None
        out[pid] = SlurmTask(job_id=parts[1], step=step, local_id=_int(parts[3]), global_id=_int(parts[4]))
    return out


def run_listpids(node: str | None = None) -> str | None:
    """``scontrol listpids`` on this node (every local Slurm task), or None where it cannot be had.

    With ``node`` (the Slurm node name; where several slurmd run on one machine it is required) it asks
    ``scontrol listpids '*' NODE`` first, then the plain form.
    """
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    forms = ([[scontrol, "listpids", "*", node]] if node else []) + [[scontrol, "listpids"]]
    for argv in forms:
        try:
            done = subprocess.run(
                argv, capture_output=True, timeout=LISTPIDS_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return done.stdout[:MAX_LISTPIDS_BYTES].decode("utf-8", "replace")
    return None


@dataclass(frozen=True)
class JobFields:
    job_id: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    debug: DebugReadiness | None = field(default=None, compare=False)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if 0 <= number < 1 << 31 else None


def job_from_environ(env: Mapping[str, str]) -> JobFields:
    """Job identity from a process environment. SENTINEL_JOB_ID wins, then Slurm, then torchelastic."""
    job = env.get("SENTINEL_JOB_ID") or env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or None
    rank = _int(env.get("RANK"))
    if rank is None:
        rank = _int(env.get("SLURM_PROCID"))
    local_rank = _int(env.get("LOCAL_RANK"))
    if local_rank is None:
        local_rank = _int(env.get("SLURM_LOCALID"))
    world = _int(env.get("WORLD_SIZE"))
    if world is None:
        world = _int(env.get("SLURM_NTASKS"))
    port = _int(env.get("MASTER_PORT"))
    return JobFields(
        job_id=job[:256] if job else None,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        master_addr=(env.get("MASTER_ADDR") or None),
        master_port=port if port is not None and port < 65536 else None,
    )


class ProcessHandle(Protocol):
    """The part of :class:`psutil.Process` the mapper reads; every call may raise a :class:`psutil.Error`."""

    def name(self) -> str: ...

    def cmdline(self) -> list[str]: ...

    def create_time(self) -> float: ...

    def environ(self) -> dict[str, str]: ...

    def status(self) -> str: ...

    def parent(self) -> ProcessHandle | None: ...


class ProcessTable(Protocol):
    """The host's process table: ``/proc`` through psutil, or a simulated host's ranks."""

    def process(self, pid: int) -> ProcessHandle:
        """The process ``pid`` (raises :class:`psutil.NoSuchProcess` when there is none)."""
        ...

    def owner_uid(self, pid: int) -> int | None:
        """The user ``pid`` runs as (None when gone); the probe socket checks senders against it."""
        ...


class PsutilProcesses:
    """This machine's processes."""

    def process(self, pid: int) -> ProcessHandle:
        return psutil.Process(pid)

    def owner_uid(self, pid: int) -> int | None:
        return owner_uid(pid)


def owner_uid(pid: int) -> int | None:
    """The user this machine's process ``pid`` runs as (the owner of ``/proc/<pid>``), None when gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


class JobMapper:
    """Maps the pids NVML reports on each GPU to ProcInfo with job/rank.

    ``processes`` is the process table (this machine's, or a simulated host's), ``proc_root`` where the
    cgroup files are read (``/proc``; a fixture tree in tests) and ``listpids`` returns ``scontrol listpids``
    output (None: not available); the last two are consulted only for a process whose environment gave no
    job.
    """

    def __init__(
        self,
        tailed_globs: list[str] | None = None,
        *,
        proc_root: Path = Path("/proc"),
        listpids: Callable[[], str | None] | None = run_listpids,
        processes: ProcessTable | None = None,
    ) -> None:
        self.processes: ProcessTable = processes if processes is not None else PsutilProcesses()
        self.tailed_globs = list(tailed_globs or [])
        self._cache: dict[tuple[int, float, tuple[str, ...]], tuple[str, JobFields]] = {}
        self.permission_errors = 0
        self.vanished = 0
        self.from_cgroup = 0
        self.proc_root = proc_root
        self.listpids = listpids
        self._listed: dict[int, SlurmTask] | None = None  # one listpids per map() call, when needed

    def slurm_task(self, pid: int) -> SlurmTask | None:
        """The Slurm task of ``pid`` from its cgroup, with the rank from ``scontrol listpids`` when known."""
        try:
            with (self.proc_root / str(pid) / "cgroup").open("rb") as handle:
                text = handle.read(MAX_CGROUP_BYTES).decode("utf-8", "replace")
        except OSError:
            text = ""
        task = slurm_from_cgroup(text)
        if self._listed is None and self.listpids is not None:
            self._listed = parse_listpids(self.listpids() or "")
        listed = (self._listed or {}).get(pid)
        if listed is not None and (task is None or task.job_id == listed.job_id):
            # listpids names every process of a step with its *task's* ids; only the task itself (a child of
            # slurmstepd) is that task — a rank forked by a per-node launcher (torchrun under srun) is not
            own = self._is_task(pid)
            fallback = task.local_id if task else None
            return SlurmTask(
                job_id=listed.job_id,
                step=listed.step or (task.step if task else None),
                local_id=listed.local_id if own and listed.local_id is not None else fallback,
                global_id=listed.global_id if own else None,
            )
        return task

    def _is_task(self, pid: int) -> bool:
        """Whether ``pid`` is a Slurm task itself: its parent is slurmstepd."""
        try:
            parent = self.processes.process(pid).parent()
            return parent is not None and parent.name() == "slurmstepd"
        except psutil.Error:
            return False

    def _in_disk_sleep(self, pid: int) -> bool:
        """The process state letter is ``D`` (read every poll: it is what a hung filesystem looks like)."""
        try:
            return self.processes.process(pid).status() == psutil.STATUS_DISK_SLEEP
        except (psutil.Error, OSError):
            return False

    def _inspect(self, pid: int) -> tuple[str, JobFields] | None:
        try:
            proc = self.processes.process(pid)
            # The command line is part of the key: a process seen between fork and exec still has its
            # parent's environment (and no job identity of its own); after the exec it is a new program
            # under the same pid and create time, and must be read again.
            cmdline = tuple(proc.cmdline())
            key = (pid, proc.create_time(), cmdline)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self.vanished += 1
            return None
        except (psutil.AccessDenied, OSError):
            self.permission_errors += 1
            return None
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        name = ""
        fields = JobFields()
        try:
            name = proc.name()
            env = proc.environ()
            fields = job_from_environ(env)
            if fields.job_id is None:
                fields = _from_cmdline(list(cmdline), fields)
            if fields.job_id is not None:
                globs = self.tailed_globs
                readiness = assess(env, lambda path: pattern_is_tailed(path, globs))
                fields = JobFields(**{**fields.__dict__, "debug": readiness})
        except psutil.AccessDenied:
            self.permission_errors += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self.vanished += 1
            return None
        except OSError:
            self.permission_errors += 1
        if fields.job_id is None:
            task = self.slurm_task(pid)
            if task is not None:
                self.from_cgroup += 1
                fields = replace(
                    fields,
                    job_id=task.job_id,
                    rank=fields.rank if fields.rank is not None else task.global_id,
                    local_rank=fields.local_rank if fields.local_rank is not None else task.local_id,
                )
        if len(self._cache) >= MAX_CACHE:
            self._cache.clear()
        self._cache[key] = (name, fields)
        return name, fields

    def map(self, pids_by_gpu: Mapping[int, list[int]]) -> list[ProcInfo]:
        """ProcInfo for every (gpu, pid); never raises."""
        self._listed = None
        out: list[ProcInfo] = []
        for gpu, pids in sorted(pids_by_gpu.items()):
            for pid in pids:
                found = self._inspect(pid)
                if found is None:
                    out.append(ProcInfo(gpu=gpu, pid=pid))
                    continue
                name, f = found
                out.append(
                    ProcInfo(
                        gpu=gpu,
                        pid=pid,
                        name=name[:128],
                        job_id=f.job_id,
                        rank=f.rank,
                        local_rank=f.local_rank,
                        world_size=f.world_size,
                        master_addr=f.master_addr,
                        master_port=f.master_port,
                        debug=f.debug,
                        blocked_io=self._in_disk_sleep(pid),
                    )
                )
        return out


def _from_cmdline(cmdline: list[str], fields: JobFields) -> JobFields:
    """``--rdzv-id=X`` / ``--rdzv_id X`` on a torchrun command line names the job when the env does not."""
    for i, arg in enumerate(cmdline[:512]):
        for flag in ("--rdzv-id", "--rdzv_id"):
            if arg.startswith(flag + "="):
                return JobFields(**{**fields.__dict__, "job_id": arg.split("=", 1)[1][:256] or None})
            if arg == flag and i + 1 < len(cmdline):
                return JobFields(**{**fields.__dict__, "job_id": cmdline[i + 1][:256] or None})
    return fields

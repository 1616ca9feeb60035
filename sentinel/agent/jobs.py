"""GPU → process → job/rank, from each GPU process's environment and command line (psutil).

Launchers leave the job identity in the environment of every rank: Slurm (SLURM_JOB_ID, SLURM_PROCID),
torchrun (TORCHELASTIC_RUN_ID, RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or an explicit
SENTINEL_JOB_ID. Reading another user's /proc/<pid>/environ needs privileges: a refusal is counted, and the
process is still reported (pid and name) without job fields. Results are cached per (pid, create time), so a
long-running rank costs one read, not one per poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import psutil

from sentinel.components.nccl_debug.record import DebugReadiness
from sentinel.components.nccl_debug.rule import assess, pattern_is_tailed
from sentinel.log import get_logger
from sentinel.wire import ProcInfo

log = get_logger(module="agent.jobs")

MAX_CACHE = 4096


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


class JobMapper:
    """Maps the pids NVML reports on each GPU to ProcInfo with job/rank."""

    def __init__(self, tailed_globs: list[str] | None = None) -> None:
        self.tailed_globs = list(tailed_globs or [])
        self._cache: dict[tuple[int, float, tuple[str, ...]], tuple[str, JobFields]] = {}
        self.permission_errors = 0
        self.vanished = 0

    def _inspect(self, pid: int) -> tuple[str, JobFields] | None:
        try:
            proc = psutil.Process(pid)
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
        if len(self._cache) >= MAX_CACHE:
            self._cache.clear()
        self._cache[key] = (name, fields)
        return name, fields

    def map(self, pids_by_gpu: Mapping[int, list[int]]) -> list[ProcInfo]:
        """ProcInfo for every (gpu, pid); never raises."""
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

"""GPU process → job/rank mapping on real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.agent.jobs import JobMapper, job_from_environ


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    envs = [
        {"SLURM_JOB_ID": "81234", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"},
        {
            "TORCHELASTIC_RUN_ID": "train-a",
            "RANK": "3",
            "LOCAL_RANK": "3",
            "WORLD_SIZE": "8",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
        },
        {"SENTINEL_JOB_ID": "explicit", "SLURM_JOB_ID": "999", "RANK": "0"},
    ]
    for extra in envs:
        env = {"PATH": os.environ.get("PATH", ""), **extra}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                env=env,
                stdout=subprocess.PIPE,
            )
        )
    for p in procs:  # each child has exec'd its own program (and environment) once it says so
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_maps_real_processes_to_jobs(ranks: list[subprocess.Popen[bytes]]) -> None:
    mapper = JobMapper()
    result = mapper.map({0: [ranks[0].pid], 3: [ranks[1].pid], 5: [ranks[2].pid]})
    by_gpu = {p.gpu: p for p in result}
    assert (by_gpu[0].job_id, by_gpu[0].rank, by_gpu[0].local_rank, by_gpu[0].world_size) == (
        "81234",
        9,
        1,
        16,
    )
    assert (by_gpu[3].job_id, by_gpu[3].rank, by_gpu[3].world_size) == ("train-a", 3, 8)
    assert (by_gpu[3].master_addr, by_gpu[3].master_port) == ("10.0.0.1", 29500)
    assert (by_gpu[5].job_id, by_gpu[5].rank) == ("explicit", 0)
    assert by_gpu[0].name.startswith("python")
    assert not any(p.blocked_io for p in result)  # sleeping in time.sleep is S, not D


def test_a_process_in_disk_sleep_is_reported_blocked_in_io(
    ranks: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil reads the state letter from /proc/PID/stat; a D there (a hung NFS read) is what we report."""
    real_status = psutil.Process.status

    def status(self: psutil.Process) -> str:
        return psutil.STATUS_DISK_SLEEP if self.pid == ranks[1].pid else real_status(self)

    monkeypatch.setattr(psutil.Process, "status", status)
    by_pid = {p.pid: p for p in JobMapper().map({0: [ranks[0].pid], 1: [ranks[1].pid]})}
    assert by_pid[ranks[1].pid].blocked_io and not by_pid[ranks[0].pid].blocked_io


def test_a_process_seen_before_its_exec_is_read_again_after_it() -> None:
    """Between fork and exec a child still carries its parent's environment; the mapper must not keep that."""
    mapper = JobMapper()
    env = {"PATH": os.environ.get("PATH", ""), "SENTINEL_JOB_ID": "child-job", "RANK": "4"}
    code = (
        "import os, sys; sys.stdin.readline(); os.execve(sys.executable, [sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(60)'], "
        + repr(env)
        + ")"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        env={"PATH": os.environ.get("PATH", "")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        (before,) = mapper.map({0: [child.pid]})
        assert before.job_id is None  # the launcher side: no job identity yet
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"1\n"  # exec'd: same pid, same create time, new program
        (after,) = mapper.map({0: [child.pid]})
        assert (after.job_id, after.rank) == ("child-job", 4)
    finally:
        child.kill()
        child.wait()


def test_vanished_and_denied_processes_are_counted_not_fatal(
    ranks: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mapper = JobMapper()

    real_environ = psutil.Process.environ

    def denied(self: psutil.Process) -> dict[str, str]:
        if self.pid == ranks[1].pid:
            raise psutil.AccessDenied(self.pid)
        return real_environ(self)

    monkeypatch.setattr(psutil.Process, "environ", denied)
    result = mapper.map({0: [dead.pid, ranks[0].pid], 1: [ranks[1].pid]})
    by_pid = {p.pid: p for p in result}
    assert by_pid[dead.pid].job_id is None
    assert by_pid[ranks[1].pid].job_id is None and by_pid[ranks[1].pid].gpu == 1
    assert by_pid[ranks[0].pid].job_id == "81234"
    assert mapper.permission_errors == 1 and mapper.vanished == 1


def test_environ_parsing_rejects_garbage() -> None:
    fields = job_from_environ({"RANK": "-1", "WORLD_SIZE": "x", "MASTER_PORT": "99999", "SLURM_JOB_ID": "7"})
    assert (
        fields.job_id == "7"
        and fields.rank is None
        and fields.world_size is None
        and fields.master_port is None
    )


def test_denied_environ_falls_back_to_the_slurm_cgroup_and_listpids(
    ranks: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A rank whose environ the agent may not read is still mapped: job and local task from its cgroup (a
    fixture tree with the v2 layout), the job confirmed by ``scontrol listpids``."""
    pid = ranks[1].pid
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cgroup").write_text(
        "0::/system.slice/slurmstepd.scope/job_5150/step_0/user/task_1\n"
    )
    listing = f"PID JOBID STEPID LOCALID GLOBALID\n{pid} 5150 0 1 9\n"
    real_environ = psutil.Process.environ

    def denied(self: psutil.Process) -> dict[str, str]:
        if self.pid == pid:
            raise psutil.AccessDenied(self.pid)
        return real_environ(self)

    monkeypatch.setattr(psutil.Process, "environ", denied)
    by_pid = {p.pid: p for p in JobMapper(proc_root=tmp_path, listpids=lambda: listing).map({1: [pid]})}
    # not a child of slurmstepd: listpids' task ids are its launcher's, so only the job is taken from it
    # (tests/slurm/test_slurm_e2e.py checks a real task's global rank from a real scontrol listpids)
    assert (by_pid[pid].job_id, by_pid[pid].rank, by_pid[pid].local_rank) == ("5150", None, 1)
    # without listpids the cgroup alone still names the job and the local task
    alone = JobMapper(proc_root=tmp_path, listpids=lambda: None).map({1: [pid]})
    assert (alone[0].job_id, alone[0].rank, alone[0].local_rank) == ("5150", None, 1)
    # the environment stays the first choice where it is readable
    first = JobMapper(proc_root=tmp_path, listpids=lambda: listing).map({0: [ranks[0].pid]})
    assert first[0].job_id == "81234"

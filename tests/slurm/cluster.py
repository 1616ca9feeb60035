"""A throwaway real Slurm on 127.0.0.1 for the end-to-end tests: munged, slurmctld and one slurmd per node name.

Everything lives in one temporary folder (keys, sockets, state, logs, ``slurm.conf``) and every port is picked
free at start (other test runs share the machine). ``SLURM_CONF`` points the Slurm commands at it; the munge
socket is named through ``AuthInfo`` so the system's munged (if any) is never touched. Several node names run
on this one machine as several ``slurmd -N NAME`` when the build allows it (Debian's does); each gets its own
port and spool folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...]
    health_check: str = ""
    health_interval_s: int = 0
    prolog: str = ""
    epilog: str = ""
    #: the job credential lifetime, which is also how long a requeued job waits to start again (0: Slurm's)
    cred_expire_s: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        """Environment for Slurm commands (scontrol, srun, sinfo) against this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for name in list(env):
            if name.startswith(("SLURM_JOB", "SLURM_STEP", "SLURMD_")):
                del env[name]
        return env

    def run(self, *args: str, timeout: float = 15.0, check: bool = True) -> str:
        done = subprocess.run(
            list(args), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: rc {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        self._start_munge()
        self._write_conf()
        for name in ("state", "log"):
            (self.root / name).mkdir(exist_ok=True)
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
            self._spawn(["slurmd", "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}")
        self.wait_idle(timeout_s)

    def _spawn(self, argv: list[str], name: str) -> None:
        log = (self.root / "log" / f"{name}.out").open("wb")
        proc = subprocess.Popen(
            argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)

    def _start_munge(self) -> None:
        d = self.root / "munge"
        d.mkdir(mode=0o700, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        proc = subprocess.Popen(
            [
                "munged",
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(d / 'munged.log').read_text()[-500:]}")
            time.sleep(0.05)

    def _write_conf(self) -> None:
        user = pwd.getpwuid(os.getuid()).pw_name
        lines = [
            "ClusterName=sentineltest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}"
            + (f",cred_expire={self.cred_expire_s}" if self.cred_expire_s else ""),
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=30",
            "KillWait=2",
            "Waittime=0",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmctldParameters=enable_configless",
        ]
        if self.health_check:
            lines += [
                f"HealthCheckProgram={self.health_check}",
                f"HealthCheckInterval={self.health_interval_s or 5}",
                "HealthCheckNodeState=ANY",
            ]
        if self.prolog:
            lines.append(f"Prolog={self.prolog}")
        if self.epilog:
            lines.append(f"Epilog={self.epilog}")
        cpus = os.cpu_count() or 1
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
                f"CPUs={cpus} RealMemory=1000 State=UNKNOWN"
            )
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                last = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=5)
                states = dict(line.split() for line in last.splitlines() if line.strip())
                if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"slurm nodes not idle within {timeout_s} s: {last!r}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                out.append(f"== {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(out)

    def leftovers(self) -> list[psutil.Process]:
        """Processes still running against this cluster (``SLURM_CONF`` is its conf), the caller and its
        ancestors aside: ``slurmstepd`` double-forks out of slurmd's session, so a step still tearing down
        when its slurmd goes outlives it, and any task it kept. The environment is read raw: slurmstepd's
        process title overwrites the head of it with NULs, where psutil's ``environ()`` stops."""
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        wanted = b"SLURM_CONF=" + os.fsencode(self.conf)
        out = []
        for p in psutil.process_iter():
            if p.pid in mine:
                continue
            with contextlib.suppress(OSError, psutil.Error):
                if wanted in Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0"):
                    out.append(p)
        return out

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.procs.clear()
        # steps and their tasks left behind by the daemons (the machine is shared with later runs)
        left = self.leftovers()
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(left, timeout=5)

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) of ``node`` as scontrol shows it."""
        text = self.run("scontrol", "show", "node", node, "-o")
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        reason = ""
        if "Reason=" in text:
            reason = text.split("Reason=", 1)[1].split(" [", 1)[0]
        return fields.get("State", ""), reason


@contextlib.contextmanager
def slurm_cluster(root: Path, nodes: Sequence[str], **options: object) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, tuple(nodes), **options)  # type: ignore[arg-type]
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def available() -> bool:
    return all(shutil.which(b) for b in ("munged", "slurmctld", "slurmd", "scontrol", "srun"))

"""Simulated hosts, offered to the real agent at its OS and library boundaries.

A :class:`SimHost` is the agent's GPU source (what NVML would answer) and, through :meth:`SimHost.inputs`,
every other boundary it reads a host at: kernel log records, job log lines, the process table, probe
datagrams and IB ports from sysfs. Everything above those boundaries is the real agent's. ``sentinel demo``
maps wall time onto scenario time; ``sentinel sim`` passes its virtual clock and runs inline (a hung NVML
call raises :class:`~sentinel.agent.worker.CallBlocks` instead of blocking). ``host_down`` is reported by
:meth:`SimCluster.drive` so the caller stops that agent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import psutil

from sentinel.agent.jobs import ProcessHandle
from sentinel.agent.kmsg import KmsgRecord, parse_kmsg_record
from sentinel.agent.probe import Credentials
from sentinel.agent.source import GpuLostError, HostInputs
from sentinel.agent.worker import CallBlocks
from sentinel.components.ib.sysfs import PortScan
from sentinel.config.agent import (
    AgentConfig,
    AgentIdentity,
    CollectConfig,
    KmsgConfig,
    LogsConfig,
    NcclRasConfig,
    ProbeConfig,
    RingConfig,
    StreamConfig,
    SystemdConfig,
)
from sentinel.config.common import MetricsConfig
from sentinel.sim.cluster import ClusterSim, GpuSim, HostSim
from sentinel.sim.scenario import Scenario
from sentinel.wire import GpuInfo, GpuSample

PROBE_INTERVAL_S = 2.0
#: where a simulated rank's NCCL_DEBUG_FILE goes; the simulated agents' ``logs.globs`` cover it
LOG_DIR = "/var/log/sentinel-sim"
LOG_GLOB = f"{LOG_DIR}/*.log"
#: the user every simulated rank runs as (the probe socket sees it as the datagrams' sender)
RANK_UID = 1000


@dataclass(frozen=True)
class SimXid:
    gpu: int
    xid: int
    t: float
    text: str


class NvmlHangReleased(Exception):
    """A hung simulated NVML call was released because the source closed."""


class SimCluster:
    """The cluster model behind every :class:`SimHost` of one scenario, thread-safe."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        started_at: float,
        clock: Callable[[], float],
        inline: bool = False,
    ) -> None:
        self.scenario = scenario
        self.model = ClusterSim(scenario)
        self.started_at = started_at
        self.clock = clock
        #: virtual clock: nothing may block (a hung NVML call is declared with CallBlocks)
        self.inline = inline
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.closed = threading.Event()
        self._last_tick = -1
        self.hosts = [SimHost(self, host) for host in self.model.hosts]

    def sim_t(self, now: float) -> float:
        return now - self.started_at

    def advance(self, now: float) -> float:
        """Move the model to clock time ``now`` (faults due are applied); returns scenario time."""
        t = now - self.started_at
        if t > self.model.now:
            with self.lock:
                if t > self.model.now:
                    self.model.advance(t)
                    second = int(t)
                    if second != self._last_tick:
                        self._last_tick = second
                        self.model.tick_faults(float(second))
                    self.changed.notify_all()
        return t

    def down(self, name: str, now: float) -> bool:
        host = self.model.by_name[name]
        return self.sim_t(now) >= host.down_at

    async def drive(self, on_host_down: Callable[[str], None], tick_s: float | None = None) -> None:
        """Advance the model every tick (so faults fire on time) and report hosts that go down."""
        tick = tick_s or self.scenario.tick_s
        reported: set[str] = set()
        while not self.closed.is_set():
            now = self.clock()
            self.advance(now)
            for host in self.model.hosts:
                if host.name not in reported and self.down(host.name, now):
                    reported.add(host.name)
                    on_host_down(host.name)
            await asyncio.sleep(tick / 2)

    def close(self) -> None:
        self.closed.set()
        for host in self.hosts:
            host.closed.set()
        with self.lock:
            self.changed.notify_all()


class SimHost:
    """One simulated host as the agent sees it: its GPU source, and its other inputs (:meth:`inputs`)."""

    def __init__(self, cluster: SimCluster, host: HostSim) -> None:
        self.cluster = cluster
        self.host = host
        self.name = host.name
        self.closed = threading.Event()
        self.kernel_log = SimKernelLog(self)
        self.job_logs = SimJobLogs(self)
        self.processes = SimProcesses(self)
        self.probe = SimProbe(self)
        self.ib_ports = SimPorts(self)

    def inputs(self) -> HostInputs:
        """This host's boundaries for ``Agent(config, host, host.inputs(), ...)``."""
        return HostInputs(
            kernel_log=self.kernel_log,
            job_logs=self.job_logs,
            processes=self.processes,
            probe=self.probe,
            ib_ports=self.ib_ports,
            boot_id=f"00000000-0000-4000-8000-{self.host.index:012x}",
            simulated=True,
        )

    # -- GpuSource ------------------------------------------------------------------------------------

    def open(self) -> list[GpuInfo]:
        t = self.cluster.advance(self.cluster.clock())
        inventory = self.cluster.model.inventory(self.host)
        # a GPU that fell off the bus does not come back with a re-initialisation: NVML cannot reach it
        return [
            msgspec.structs.replace(info, error="GPU is lost") if gpu.unreachable(t) else info
            for info, gpu in zip(inventory, self.host.gpus, strict=True)
        ]

    def _read(self, gpu: int, now: float, slow: bool) -> GpuSample:
        cluster = self.cluster
        model = cluster.model
        t = now - cluster.started_at
        if t > model.now:
            cluster.advance(now)
        with cluster.lock:
            view = self.host.gpus[gpu]
            if view.unreachable(t):
                raise GpuLostError(f"GPU {gpu}: GPU is lost")
            if t < view.nvml_hang_at:
                sample = model.sample(self.host, view, t, slow)
                return sample if t == now else msgspec.structs.replace(sample, t=now)
        if cluster.inline:
            raise CallBlocks(f"GPU {gpu}: simulated NVML hang")
        self.closed.wait()  # an NVML call that never returns, until the source is closed
        raise NvmlHangReleased(f"GPU {gpu}: simulated NVML hang released at close")

    def read_fast(self, gpu: int, now: float) -> GpuSample:
        return self._read(gpu, now, slow=False)

    def read_slow(self, gpu: int, now: float) -> GpuSample:
        return self._read(gpu, now, slow=True)

    def wait_xid_events(self, timeout_s: float) -> list[SimXid]:
        cluster = self.cluster
        if cluster.inline:
            cluster.advance(cluster.clock())
            if not self.host.xids:  # nothing raised, and an inline source never waits
                return []
        with cluster.changed:
            if not self.host.xids and not self.closed.is_set() and timeout_s > 0:
                cluster.changed.wait(timeout_s)
            due = self.host.xids
            self.host.xids = []
        return [SimXid(gpu=gpu, xid=xid, t=cluster.started_at + t, text=text) for t, gpu, xid, text in due]

    def close(self) -> None:
        """Release this host's hung calls (the other hosts keep running)."""
        self.closed.set()
        with self.cluster.changed:
            self.cluster.changed.notify_all()


class SimKernelLog:
    """The host's kernel ring as ``/dev/kmsg`` yields it: ``prio,seq,usec,-;message`` records, parsed by the
    agent's own record parser."""

    path = "/dev/kmsg (simulated)"
    open_errors = 0
    is_open = True

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self._seq = 0

    def poll(self, now: float) -> list[KmsgRecord]:
        cluster = self.host.cluster
        cluster.advance(now)
        with cluster.lock:
            lines, self.host.host.kernel_lines = self.host.host.kernel_lines, []
        out: list[KmsgRecord] = []
        for t, priority, message in lines:
            self._seq += 1
            raw = f"{priority},{self._seq},{max(0, int(t * 1e6))},-;{message}".encode()
            record = parse_kmsg_record(raw)
            if record is not None:
                out.append(record)
        return out

    def save_cursor(self) -> None:
        """A simulated host does not outlive its run: nothing to resume from."""

    def close(self) -> None:
        """Nothing open."""


class SimJobLogs:
    """The ranks' NCCL debug files (``NCCL_DEBUG_FILE``) as the tailer yields them: ``(path, line)``."""

    cut_lines = 0
    refused_files = 0

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self._files: set[str] = set()

    @property
    def files(self) -> list[str]:
        return sorted(self._files)

    def poll(self, now: float) -> list[tuple[str, str]]:
        cluster = self.host.cluster
        cluster.advance(now)
        with cluster.lock:
            lines, self.host.host.job_lines = self.host.host.job_lines, []
        out: list[tuple[str, str]] = []
        for _, gpu, line in lines:
            path = f"{LOG_DIR}/nccl.{self.host.name}.{self.host.host.gpus[gpu].pid}.log"
            self._files.add(path)
            out.append((path, line))
        return out

    def close(self) -> None:
        """Nothing open."""


class SimProcess:
    """One rank's process as psutil shows it: launched by torchrun, its job and rank in its environment."""

    def __init__(self, host: SimHost, gpu: GpuSim) -> None:
        self.host = host
        self.gpu = gpu
        self.pid = gpu.pid
        job = gpu.job
        assert job is not None and gpu.rank is not None
        self._environ = {
            "TORCHELASTIC_RUN_ID": job.job_id,
            "RANK": str(gpu.rank),
            "LOCAL_RANK": str(gpu.index),
            "WORLD_SIZE": str(job.world_size),
            "MASTER_ADDR": "10.0.0.0",
            "MASTER_PORT": "29500",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "NCCL_DEBUG": "WARN",
            "NCCL_DEBUG_FILE": f"{LOG_DIR}/nccl.%h.%p.log",
        }
        self._cmdline = ["python", "-m", "train", f"--rdzv-id={job.job_id}"]
        self._created = host.cluster.started_at + max(0.0, job.start_s)

    def _alive(self) -> None:
        gpu = self.gpu
        job = gpu.job
        t = self.host.cluster.model.now
        if job is None or gpu.rank is None or t >= job.ranks[gpu.rank].dead_at:
            raise psutil.NoSuchProcess(self.pid, "python")

    def name(self) -> str:
        self._alive()
        return "python"

    def cmdline(self) -> list[str]:
        self._alive()
        return list(self._cmdline)

    def create_time(self) -> float:
        self._alive()
        return self._created

    def environ(self) -> dict[str, str]:
        self._alive()
        return dict(self._environ)

    def status(self) -> str:
        self._alive()
        return str(psutil.STATUS_RUNNING)

    def parent(self) -> ProcessHandle | None:
        return None


class SimProcesses:
    """The host's process table: its ranks' processes by pid (nothing else runs on a simulated host)."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self._by_pid = {g.pid: g for g in host.host.gpus}
        self._procs: dict[int, SimProcess] = {}

    def process(self, pid: int) -> ProcessHandle:
        found = self._procs.get(pid)
        if found is not None:
            return found
        gpu = self._by_pid.get(pid)
        if gpu is None or gpu.job is None or gpu.rank is None:
            raise psutil.NoSuchProcess(pid)
        found = self._procs[pid] = SimProcess(self.host, gpu)
        return found

    def owner_uid(self, pid: int) -> int | None:
        return RANK_UID if pid in self._by_pid else None


class SimProbe:
    """What the probe socket receives from the host's ranks: one msgpack FrHeads per rank at the probe's
    cadence, sent by the rank's own process (the kernel's credentials name its pid and uid). The probe
    does not know its host or GPU; the agent fills those in."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self._next = 0.0
        self._encoder = msgspec.msgpack.Encoder()
        self._creds: dict[int, Credentials] = {}  # by sender pid

    def receive(self, now: float) -> list[tuple[bytes, Credentials | None]]:
        if now < self._next:
            return []
        self._next = now + PROBE_INTERVAL_S - 0.05
        cluster = self.host.cluster
        t = cluster.advance(now)
        encode = self._encoder.encode
        out: list[tuple[bytes, Credentials | None]] = []
        creds = self._creds
        with cluster.lock:
            for pid, heads in cluster.model.sent_heads(self.host.host, t):
                sent = heads if t == now else msgspec.structs.replace(heads, t=now)
                sender = creds.get(pid)
                if sender is None:
                    sender = creds[pid] = Credentials(pid=pid, uid=RANK_UID, gid=RANK_UID)
                out.append((encode(sent), sender))
        return out


class SimPorts:
    """A simulated host's port source (the agent's ``PortSource``): the model's ports as sysfs shows them."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.gpus: dict[str, int] = {}

    def read(self) -> PortScan:
        cluster = self.host.cluster
        t = cluster.advance(cluster.clock())
        with cluster.lock:
            return cluster.model.port_scan(self.host.host, t)


def simulated_agent_config(
    host: str,
    *,
    tick_s: float,
    stream: StreamConfig | None = None,
    state_dir: str = "",
    ring_window_s: float = 600.0,
) -> AgentConfig:
    """A real agent's configuration for one simulated host (``sentinel sim`` and ``sentinel demo``).

    The agent's defaults, except: nothing of the machine it runs on is read or opened (no kernel log, no
    probe socket, no per-agent /metrics port, no NCCL RAS query: the simulated host's inputs stand in), its
    tailed globs cover the ranks' NCCL debug files, and the slow counters (row remap, ECC) are read every
    2 s, as a host under a tight deployment would. ``stream`` None: the caller takes the batches itself
    (``sentinel sim``).
    """
    return AgentConfig(
        agent=AgentIdentity(host=host, cluster="demo", state_dir=state_dir),
        collect=CollectConfig(
            tick_s=tick_s,
            slow_tick_s=max(tick_s, 2.0),
            nvml_timeout_s=max(2.0, 2 * tick_s),
        ),
        kmsg=KmsgConfig(enabled=False),
        logs=LogsConfig(globs=[LOG_GLOB]),
        probe=ProbeConfig(socket_path=""),
        nccl_ras=NcclRasConfig(enabled=False),
        stream=stream if stream is not None else StreamConfig(enabled=False),
        ring=RingConfig(window_s=ring_window_s, max_bytes=8 * 1024 * 1024),
        metrics=MetricsConfig(listen_host=""),
        systemd=SystemdConfig(notify=False),
    )


def sim_hosts(
    scenario: Scenario, *, started_at: float, clock: Callable[[], float], inline: bool = False
) -> tuple[SimCluster, list[SimHost]]:
    """Every host of ``scenario`` ready for ``Agent(config, host, host.inputs(), clock)``."""
    cluster = SimCluster(scenario, started_at=started_at, clock=clock, inline=inline)
    return cluster, cluster.hosts

"""Simulated hosts for real agents in real time (``sentinel demo``, end-to-end tests).

:class:`SimHost` implements :class:`~sentinel.agent.source.GpuSource` and
:class:`~sentinel.agent.source.HostExtras` on top of the same cluster model the virtual-clock runner uses;
wall time maps onto scenario time as ``now - started_at``. Calls behave like the real thing: a lost GPU raises
:class:`~sentinel.agent.source.GpuLostError`, a hung NVML call really blocks (until :meth:`SimHost.close`, so
no thread outlives the demo), Xids arrive through ``wait_xid_events`` and the kernel log, NCCL lines through
the job log, and heads at the probe's cadence.

``host_down`` cannot be expressed through a GPU source — the agent itself goes quiet — so
:meth:`SimCluster.drive` calls back with the host's name when it is due and the caller stops that agent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from sentinel.agent.source import GpuLostError
from sentinel.components.ib.sysfs import PortScan
from sentinel.fr.heads import FrHeads
from sentinel.sim.cluster import ClusterSim, HostSim
from sentinel.sim.scenario import Scenario
from sentinel.wire import GpuInfo, GpuSample, ProcInfo

PROBE_INTERVAL_S = 2.0


@dataclass(frozen=True)
class SimXid:
    gpu: int
    xid: int
    t: float
    text: str


class NvmlHangReleased(Exception):
    """A hung simulated NVML call was released because the source closed."""


class SimCluster:
    """The cluster model behind every :class:`SimHost` of one scenario, thread-safe, on wall time."""

    def __init__(self, scenario: Scenario, *, started_at: float, clock: Callable[[], float]) -> None:
        self.scenario = scenario
        self.model = ClusterSim(scenario)
        self.started_at = started_at
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.closed = threading.Event()
        self._last_tick = -1
        self.hosts = [SimHost(self, host) for host in self.model.hosts]

    def sim_t(self, now: float) -> float:
        return now - self.started_at

    def advance(self, now: float) -> float:
        """Move the model to wall time ``now``; returns scenario time."""
        t = self.sim_t(now)
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
    """One simulated host as the agent sees it: a GPU source and the host extras."""

    def __init__(self, cluster: SimCluster, host: HostSim) -> None:
        self.cluster = cluster
        self.host = host
        self.name = host.name
        self.closed = threading.Event()
        self._next_heads = 0.0
        self.ib_ports = SimPorts(self)  # the agent's IB collector reads this instead of sysfs

    # -- GpuSource ------------------------------------------------------------------------------------

    def open(self) -> list[GpuInfo]:
        return self.cluster.model.inventory(self.host)

    def _read(self, gpu: int, now: float, slow: bool) -> GpuSample:
        cluster = self.cluster
        t = cluster.advance(now)
        with cluster.lock:
            view = self.host.gpus[gpu]
            if t >= view.lost_at:
                raise GpuLostError(f"GPU {gpu}: GPU is lost")
            hung = t >= view.nvml_hang_at
            if not hung:
                sample = cluster.model.sample(self.host, view, t, slow)
                return msgspec.structs.replace(sample, t=now)
        self.closed.wait()  # an NVML call that never returns, until the source is closed
        raise NvmlHangReleased(f"GPU {gpu}: simulated NVML hang released at close")

    def read_fast(self, gpu: int, now: float) -> GpuSample:
        return self._read(gpu, now, slow=False)

    def read_slow(self, gpu: int, now: float) -> GpuSample:
        return self._read(gpu, now, slow=True)

    def wait_xid_events(self, timeout_s: float) -> list[SimXid]:
        cluster = self.cluster
        with cluster.changed:
            if not self.host.xids and not self.closed.is_set():
                cluster.changed.wait(timeout_s)
            due = self.host.xids
            self.host.xids = []
        return [
            SimXid(gpu=gpu, xid=xid, t=self.cluster.started_at + t, text=text) for t, gpu, xid, text in due
        ]

    def close(self) -> None:
        """Release this host's hung calls (the other hosts keep running)."""
        self.closed.set()
        with self.cluster.changed:
            self.cluster.changed.notify_all()

    # -- HostExtras -----------------------------------------------------------------------------------

    def kernel_log_lines(self, now: float) -> list[str]:
        self.cluster.advance(now)
        with self.cluster.lock:
            lines, self.host.kernel_lines = self.host.kernel_lines, []
            lines.extend(self.host.ib_kernel_lines)
            self.host.ib_kernel_lines = []
        return lines

    def job_log_lines(self, now: float) -> list[str]:
        self.cluster.advance(now)
        with self.cluster.lock:
            lines = [line for _, _, line in self.host.job_lines]
            self.host.job_lines = []
        return lines

    def processes(self, now: float) -> list[ProcInfo]:
        t = self.cluster.advance(now)
        with self.cluster.lock:
            return self.cluster.model.processes(self.host, t)

    def fr_heads(self, now: float) -> list[FrHeads]:
        if now < self._next_heads:
            return []
        self._next_heads = now + PROBE_INTERVAL_S - 0.05
        t = self.cluster.advance(now)
        with self.cluster.lock:
            heads = self.cluster.model.heads(self.host, t)
        return [msgspec.structs.replace(h, t=now) for h in heads]


class SimPorts:
    """A simulated host's port source (the agent's ``PortSource``): the model's ports at wall time."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.gpus: dict[str, int] = {}
        self.clock = host.cluster.clock

    def read(self) -> PortScan:
        cluster = self.host.cluster
        t = cluster.advance(self.clock())
        with cluster.lock:
            return cluster.model.port_scan(self.host.host, t)


def sim_hosts(
    scenario: Scenario, *, started_at: float, clock: Callable[[], float]
) -> tuple[SimCluster, list[SimHost]]:
    """Every host of ``scenario`` ready for ``Agent(config, host, host, clock)``."""
    cluster = SimCluster(scenario, started_at=started_at, clock=clock)
    return cluster, cluster.hosts

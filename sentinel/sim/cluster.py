"""The simulated cluster: hosts x GPUs with plausible, seeded metrics, jobs, and the faults of a scenario.

Time is always passed in (virtual seconds since the scenario start); nothing here reads a clock or sleeps,
so the virtual-clock runner can drive thousands of GPUs through hours in seconds, and
:class:`sentinel.sim.host.SimHost` can map wall time onto the same model for real agents.

Metrics follow an H100 SXM under a training load: ~97-100% utilisation, ~650 W of a 700 W limit, 60-70 °C,
SM clock at the 1,980 MHz boost; idle GPUs sit at 345 MHz with the ``gpu_idle`` clock-event reason. A
thermally throttled GPU reports the thermal slowdown bits and accumulates NVML thermal violation time (slow
reads, in closed form of ``t``); every GPU's power violation time grows by a fraction of a percent.
Per-GPU offsets (silicon lottery, airflow) and per-sample noise come from seeded tables, so a run is
reproducible and cheap.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from sentinel.components.clocks.record import ClockViolations
from sentinel.components.ib.sysfs import PortScan
from sentinel.fr.heads import FrHeads
from sentinel.sim.jobs import INF, JobSim, RankSim
from sentinel.sim.ports import SimPort, scan
from sentinel.sim.scenario import FaultSpec, Scenario, host_name
from sentinel.wire import EccCounters, GpuInfo, GpuSample, NvLink, RowRemap

MAX_CLOCK_MHZ = 1980.0
IDLE_CLOCK_MHZ = 345.0
MEM_CLOCK_MHZ = 2619.0
POWER_LIMIT_W = 700.0
MEM_TOTAL = 80 * 1024**3
NVLINKS = 18
_NOISE = 1024
POOL = 16
POOL_STEP = 5  # coprime with POOL: every variant comes round once per POOL ticks
#: Xids after which the GPU is gone (79) or the process on it dies (fatal hardware Xids).
XID_GPU_LOST = frozenset({79})
XID_KILLS_PROCESS = frozenset({48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 136, 140, 143, 149, 154})
#: The Xid a row-remap event raises in the kernel log, as the driver does.
XID_ROW_REMAP_EVENT = 63
XID_ROW_REMAP_FAILURE = 64
#: NVML violation time: the share of time the thermal policy holds a thermally throttled GPU's clocks back,
#: and the power policy's nudges on every GPU (a fraction of a percent: noise, far below a straggler reason)
THERMAL_VIOLATION_SHARE = 0.95
POWER_VIOLATION_NOISE = 0.001
#: an xid_storm's reports are spread over this many seconds (a teardown reaches every GPU within seconds)
STORM_SPREAD_S = 3.0
#: an xid_recurring GPU is reset this long after each occurrence (the operator's or the remedy's reset), and
#: NVML cannot reach it for one tick meanwhile: the agent sees it lost, then answering again
RESET_AFTER_S = 4.0
#: kernel log priorities (NVRM prints Xids at KERN_WARNING, mlx5_core its module errors at KERN_ERR)
KERN_ERR = 3
KERN_WARNING = 4
#: the NVSwitches' PCI buses (0xc5 onwards: above every simulated GPU's and HCA's)
SWITCH_BUS_BASE = 0xC5
#: what the switch driver says after a few fatal SXids' codes (the rest: a generic description)
SXID_TEXT = {
    24007: "sourcetrack timeout error",
    20034: "LTSSM Fault Up",
    12028: "egress non-posted PRIV error",
    26006: "SOE HALTED",
}


@dataclass
class GpuSim:
    """One simulated GPU: identity, per-GPU offsets and fault state."""

    host: int
    index: int
    uuid: str
    pci_bus: str
    temp_off: float
    power_off: float
    lost_at: float = INF
    #: NVML cannot reach the GPU in [reset_from, reset_until): it is being reset
    reset_from: float = INF
    reset_until: float = INF
    nvml_hang_at: float = INF
    throttle_clock: float | None = None
    throttle_since: float = INF
    remap: RowRemap = field(default_factory=lambda: RowRemap(hist_max=640))
    ecc: EccCounters = field(
        default_factory=lambda: EccCounters(
            volatile_corrected=0, volatile_uncorrected=0, aggregate_corrected=0, aggregate_uncorrected=0
        )
    )
    nvlink_rate: float = 0.0
    nvlink_since: float = 0.0
    nvlink_base: int = 0
    nvlink_cache: list[NvLink] = field(default_factory=list)
    nvlink_cache_n: int = -1
    job: JobSim | None = None
    rank: int | None = None
    pid: int = 0
    pool: dict[tuple[str, float | None], list[GpuSample]] = field(default_factory=dict)
    pool_i: int = 0

    def unreachable(self, t: float) -> bool:
        """NVML calls fail with GPU_IS_LOST at ``t``: fallen off the bus, or in the middle of a reset."""
        return t >= self.lost_at or self.reset_from <= t < self.reset_until

    def violations(self, t: float) -> ClockViolations:
        """NVML's cumulative violation time at ``t``, in closed form (no per-tick state): heat holding the
        clocks back most of the time since a thermal fault, the power policy a per-GPU fraction of a percent."""
        thermal = (t - self.throttle_since) * THERMAL_VIOLATION_SHARE if t > self.throttle_since else 0.0
        power = t * POWER_VIOLATION_NOISE * (1.0 + min(1.0, max(0.0, self.power_off) / 16.0))
        return ClockViolations(reference_us=int(t * 1e6), power=int(power * 1e9), thermal=int(thermal * 1e9))

    def nvlinks(self, t: float) -> list[NvLink]:
        n = self.nvlink_base
        if self.nvlink_rate > 0 and t > self.nvlink_since:
            n += int((t - self.nvlink_since) * self.nvlink_rate)
        if n != self.nvlink_cache_n:
            first = NvLink(link=0, crc_errors=n, replay_errors=n // 4)
            rest = self.nvlink_cache[1:] if self.nvlink_cache else [NvLink(link=i) for i in range(1, NVLINKS)]
            self.nvlink_cache = [first, *rest]
            self.nvlink_cache_n = n
        return self.nvlink_cache


@dataclass
class HostSim:
    """One host: its GPUs and what its logs and event sources have produced and not yet been read."""

    index: int
    name: str
    gpus: list[GpuSim]
    noise: list[float]
    down_at: float = INF
    cursor: int = 0
    xids: list[tuple[float, int, int, str]] = field(default_factory=list)  # (t, gpu, xid, text), NVML's
    #: the kernel ring not yet read: (t, priority, message) — NVRM Xid and mlx5_core lines
    kernel_lines: list[tuple[float, int, str]] = field(default_factory=list)
    job_lines: list[tuple[float, int, str]] = field(default_factory=list)  # (t, gpu, line)
    procs_version: int = 0
    ports: list[SimPort] = field(default_factory=list)  # one IB port per GPU (mlx5_<gpu>)

    def next_noise(self) -> float:
        self.cursor = (self.cursor + 1) % _NOISE
        return self.noise[self.cursor]


class ClusterSim:
    """Everything of a scenario except the agents: ``advance(t)`` applies due faults and moves the jobs."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.tick_s = scenario.tick_s
        rng = random.Random(scenario.seed)
        n_gpus = scenario.cluster.gpus_per_host
        self.gpu_name = scenario.cluster.gpu_name
        self.hosts: list[HostSim] = []
        for h in range(scenario.cluster.hosts):
            gpus = [
                GpuSim(
                    host=h,
                    index=g,
                    uuid=f"GPU-{rng.getrandbits(32):08x}-{h:04x}-{g:04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(48):012x}",
                    pci_bus=f"0000:{(0x18 + 0x10 * g) & 0xFF:02x}:00",
                    temp_off=rng.gauss(0.0, 2.5),
                    power_off=rng.gauss(0.0, 8.0),
                    pid=100000 + h * 64 + g,
                )
                for g in range(n_gpus)
            ]
            noise = [rng.random() + rng.random() - 1.0 for _ in range(_NOISE)]
            ports = [
                SimPort(device=f"mlx5_{g.index}", pci_bus=f"{_nic_bus(g.pci_bus)}.0", gpu=g.index)
                for g in gpus
            ]
            self.hosts.append(HostSim(index=h, name=host_name(h), gpus=gpus, noise=noise, ports=ports))
        self.by_name = {host.name: host for host in self.hosts}
        self.jobs: dict[str, JobSim] = {}
        for spec in scenario.jobs:
            names = spec.hosts if spec.hosts is not None else [h.name for h in self.hosts]
            ranks: list[RankSim] = []
            for pos, name in enumerate(names):
                host = self.by_name[name]
                for gpu in host.gpus:
                    rank = pos * n_gpus + gpu.index
                    ranks.append(RankSim(rank=rank, host=host.index, gpu=gpu.index))
            job = JobSim(
                spec.id,
                ranks,
                compute_s=spec.compute_s,
                tp=spec.tp or n_gpus,
                start_s=spec.start_s,
                seed=scenario.seed,
                jitter=spec.jitter,
                pause_every_s=spec.pause_every_s,
                pause_s=spec.pause_s,
                comm_s=spec.comm_s,
            )
            self.jobs[spec.id] = job
            for r in ranks:
                gpu = self.hosts[r.host].gpus[r.gpu]
                gpu.job, gpu.rank = job, r.rank
                self.hosts[r.host].ports[r.gpu].busy_from = spec.start_s
        self.pending = sorted(scenario.faults, key=lambda f: f.at_s)
        self.applied: list[FaultSpec] = []
        self.now = 0.0

    # -- time -----------------------------------------------------------------------------------------

    def advance(self, t: float) -> None:
        while self.pending and self.pending[0].at_s <= t:
            self.apply(self.pending.pop(0))
        for job in self.jobs.values():
            job.advance(t)
        self.now = t

    def apply(self, fault: FaultSpec) -> None:
        t = fault.at_s
        if fault.kind == "xid_storm":
            self._storm(fault)
            return
        host = self.by_name[fault.host]
        self.applied.append(fault)
        if fault.kind == "host_down":
            host.down_at = t
            return
        if fault.kind == "sxid_fatal":
            assert fault.sxid is not None
            host.kernel_lines.extend((t, KERN_ERR, line) for line in sxid_lines(fault.sxid))
            return
        if fault.gpu is None:  # a host-wide fault: every GPU of the host at once (a slow host)
            for index in range(len(host.gpus)):
                self.apply(msgspec.structs.replace(fault, gpu=index))
            self.applied.pop()
            return
        gpu = host.gpus[fault.gpu]
        rank = self._rank(gpu)
        kind = fault.kind
        if kind == "xid":
            assert fault.xid is not None
            self._raise_xid(host, gpu, t, fault.xid)
            if fault.xid in XID_GPU_LOST:
                gpu.lost_at = t
            if fault.xid in XID_KILLS_PROCESS and rank is not None:
                rank.dead_at = min(rank.dead_at, t)
        elif kind == "xid_recurring":
            assert fault.xid is not None and fault.every_s is not None
            self._raise_xid(host, gpu, t, fault.xid)
            # the GPU is reset a few seconds later, and its process starts again on the clean GPU
            lost = fault.xid in XID_GPU_LOST  # fallen off the bus: unreachable until the reset
            gpu.reset_from = t if lost else t + RESET_AFTER_S
            gpu.reset_until = t + RESET_AFTER_S + self.tick_s
            gpu.pid ^= 1 << 21  # another process than the one the Xid killed
            self._schedule(msgspec.structs.replace(fault, at_s=t + fault.every_s))
        elif kind == "gpu_lost":
            gpu.lost_at = t
            if rank is not None:
                rank.dead_at = min(rank.dead_at, t)
        elif kind == "nvml_hang":
            gpu.nvml_hang_at = t
        elif kind == "row_remap_pending":
            gpu.remap = RowRemap(
                correctable=gpu.remap.correctable,
                uncorrectable=(gpu.remap.uncorrectable or 0) + 1,
                pending=True,
                failure=gpu.remap.failure,
                hist_max=639,
                hist_high=1,
            )
            self._raise_xid(host, gpu, t, XID_ROW_REMAP_EVENT)
        elif kind == "row_remap_failure":
            gpu.remap = RowRemap(
                correctable=gpu.remap.correctable,
                uncorrectable=(gpu.remap.uncorrectable or 0) + 1,
                pending=gpu.remap.pending,
                failure=True,
                hist_max=0,
                hist_none=640,
            )
            self._raise_xid(host, gpu, t, XID_ROW_REMAP_FAILURE)
        elif kind == "ecc_uncorrectable":
            assert fault.count is not None
            ecc = gpu.ecc
            gpu.ecc = EccCounters(
                volatile_corrected=ecc.volatile_corrected,
                volatile_uncorrected=(ecc.volatile_uncorrected or 0) + fault.count,
                aggregate_corrected=ecc.aggregate_corrected,
                aggregate_uncorrected=(ecc.aggregate_uncorrected or 0) + fault.count,
                dram_uncorrected=fault.count,
            )
        elif kind == "nvlink_errors":
            assert fault.rate_per_s is not None
            gpu.nvlink_base = gpu.nvlinks(t)[0].crc_errors or 0
            gpu.nvlink_since, gpu.nvlink_rate = t, fault.rate_per_s
        elif kind == "thermal_throttle":
            assert fault.clock_mhz is not None
            gpu.throttle_clock = min(fault.clock_mhz, MAX_CLOCK_MHZ)
            gpu.throttle_since = min(gpu.throttle_since, t)
            if rank is not None:
                rank.factor = MAX_CLOCK_MHZ / gpu.throttle_clock
        elif kind == "straggler":
            assert fault.slowdown is not None and rank is not None
            rank.factor = fault.slowdown
        elif kind == "hang":
            assert rank is not None
            rank.hang_at = t
        elif kind == "nccl_net_error":
            assert rank is not None
            rank.net_error_at = t
            self._net_error_lines(host, gpu, t)
        elif kind == "port_down":
            port = host.ports[gpu.index]
            port.down_at = t
            host.kernel_lines.append((t, KERN_ERR, port.module_error_line(t)))
            if rank is not None:
                rank.link_down_at = t
        elif kind == "link_flap":
            host.ports[gpu.index].flap_at = t
        elif kind == "link_degraded":
            assert fault.rate_gbps is not None
            port = host.ports[gpu.index]
            port.degraded_at, port.degraded_rate = t, fault.rate_gbps
        elif kind == "link_slow":
            assert fault.slowdown is not None
            port = host.ports[gpu.index]
            port.slow_at, port.slowdown, port.silent = t, fault.slowdown, fault.silent
            if rank is not None:
                rank.link_factor = fault.slowdown
        elif kind == "nic_lost":
            port = host.ports[gpu.index]
            port.lost_at = t
            host.kernel_lines.append((t, KERN_ERR, port.removed_line()))
            if rank is not None:
                rank.link_down_at = t
        if rank is not None and gpu.job is not None:
            gpu.job.touch(rank.rank)
            host.procs_version += 1

    def _storm(self, fault: FaultSpec) -> None:
        """Every GPU of the storm's hosts raises its Xid within ``STORM_SPREAD_S``, host by host, GPU by GPU
        (the first GPU of the first host first): one Xid fault per GPU, scheduled."""
        assert fault.hosts is not None and fault.xid is not None
        self.applied.append(fault)
        targets = [(name, g.index) for name in fault.hosts for g in self.by_name[name].gpus]
        step = STORM_SPREAD_S / max(1, len(targets))
        for i, (name, index) in enumerate(targets):
            at = fault.at_s + i * step
            self._schedule(FaultSpec(at_s=at, host=name, gpu=index, kind="xid", xid=fault.xid))

    def _schedule(self, fault: FaultSpec) -> None:
        """A fault that follows from another (a storm's reports, a recurrence), applied when due."""
        self.pending.append(fault)
        self.pending.sort(key=lambda f: f.at_s)

    def _rank(self, gpu: GpuSim) -> RankSim | None:
        if gpu.job is None or gpu.rank is None:
            return None
        return gpu.job.ranks[gpu.rank]

    def _raise_xid(self, host: HostSim, gpu: GpuSim, t: float, xid: int) -> None:
        detail = {
            79: "GPU has fallen off the bus.",
            63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
            64: "Row Remapper: Failed to remap a row.",
            48: "An uncorrectable double bit error (DBE) has been detected on GPU.",
            13: "Graphics SM Warp Exception on (GPC 1, TPC 1, SM 1): Out Of Range Address",
        }.get(xid, "simulated error")
        pid = f"pid={gpu.pid}, name=python, " if gpu.job is not None else ""
        text = f"NVRM: Xid (PCI:{gpu.pci_bus}): {xid}, {pid}{detail}"
        host.xids.append((t, gpu.index, xid, text))
        host.kernel_lines.append((t, KERN_WARNING, text))

    def _net_error_lines(self, host: HostSim, gpu: GpuSim, t: float) -> None:
        peer = (host.index + 1) % max(1, len(self.hosts))
        line = (
            f"{host.name}:{gpu.pid}:{gpu.pid + 7} [{gpu.index}] transport/net_ib.cc:2244 NCCL WARN NET/IB : "
            f"Got completion from peer 10.0.{peer // 256}.{peer % 256}<53908> with status=12 opcode=129 "
            f"len=1048576 vendor err 129 (Recv) localGid ::ffff:10.0.{host.index // 256}.{host.index % 256} "
            f"hca mlx5_{gpu.index}"
        )
        host.job_lines.append((t, gpu.index, line))

    def tick_faults(self, t: float) -> None:
        """Recurring log output of active faults (an NCCL transport keeps complaining while it is broken)."""
        for job in self.jobs.values():
            for r in job.modified.values():
                if r.net_error_at <= t and int(t) % 5 == 0:
                    host = self.hosts[r.host]
                    self._net_error_lines(host, host.gpus[r.gpu], t)

    # -- what an agent reads --------------------------------------------------------------------------

    def inventory(self, host: HostSim) -> list[GpuInfo]:
        return [
            GpuInfo(
                index=g.index,
                uuid=g.uuid,
                pci_bus=g.pci_bus,
                name=self.gpu_name,
                serial=f"16520{host.index:05d}{g.index:02d}",
                driver="550.90.07",
                vbios="96.00.89.00.01",
                memory_total_bytes=MEM_TOTAL,
                nvlinks=NVLINKS,
            )
            for g in host.gpus
        ]

    def sample(self, host: HostSim, gpu: GpuSim, t: float, slow: bool) -> GpuSample:
        """The GPU's NVML readings at ``t`` (the caller handles lost / hung GPUs).

        Readings come from a small per-GPU pool of seeded noisy variants per operating point, cycled
        tick by tick: realistic spread for the detectors at a fraction of the cost of fresh noise.
        """
        job, rank = gpu.job, gpu.rank
        point = job.load(rank, t) if job is not None and rank is not None else "idle"
        key = (point, gpu.throttle_clock)
        pool = gpu.pool.get(key)
        if pool is None:
            pool = gpu.pool[key] = [self._reading(host, gpu, point) for _ in range(POOL)]
        gpu.pool_i = i = (gpu.pool_i + POOL_STEP) % POOL
        template = pool[i]
        if slow:
            return msgspec.structs.replace(
                template,
                t=t,
                ecc=gpu.ecc,
                remap=gpu.remap,
                nvlink=gpu.nvlinks(t),
                violations=gpu.violations(t),
            )
        return msgspec.structs.replace(template, t=t)

    def _reading(self, host: HostSim, gpu: GpuSim, point: str) -> GpuSample:
        n1, n2, n3 = host.next_noise(), host.next_noise(), host.next_noise()
        throttle: list[str]
        if point == "busy":
            util = min(100.0, 98.0 + 2.5 * n1)
            power = 640.0 + gpu.power_off + 15.0 * n2
            temp = 64.0 + gpu.temp_off + 1.0 * n3
            clock = MAX_CLOCK_MHZ - 7.5 * (1.0 + n1)
            throttle = []
            mem_used = 71 * 1024**3
            util_mem = 38.0 + 4.0 * n2
            pids = [gpu.pid]
        else:
            util, util_mem = 0.0, 0.0
            power = 72.0 + gpu.power_off * 0.2 + 2.0 * n2
            temp = 34.0 + gpu.temp_off + 0.5 * n3
            clock = IDLE_CLOCK_MHZ
            throttle = ["gpu_idle"]
            mem_used = 71 * 1024**3 if point == "hung" else 512 * 1024**2
            pids = [gpu.pid] if point == "hung" else []
        if gpu.throttle_clock is not None:
            clock = gpu.throttle_clock
            temp = 91.0 + gpu.temp_off * 0.2 + n3
            throttle = ["hw_thermal_slowdown", "sw_thermal_slowdown"]
            power = power * gpu.throttle_clock / MAX_CLOCK_MHZ
        return GpuSample(
            gpu=gpu.index,
            t=0.0,
            util_gpu_pct=util,
            util_mem_pct=util_mem,
            mem_used_bytes=mem_used,
            mem_total_bytes=MEM_TOTAL,
            temp_c=temp,
            power_w=power,
            power_limit_w=POWER_LIMIT_W,
            sm_clock_mhz=clock,
            sm_clock_max_mhz=MAX_CLOCK_MHZ,
            mem_clock_mhz=MEM_CLOCK_MHZ,
            pstate=0,
            throttle=throttle,
            pcie_replay=0,
            pids=pids,
        )

    def heads(self, host: HostSim, t: float) -> list[FrHeads]:
        """The FR heads of every live rank on ``host`` at ``t``."""
        return [heads for _, heads in self.sent_heads(host, t)]

    def sent_heads(self, host: HostSim, t: float) -> list[tuple[int, FrHeads]]:
        """(sender pid, heads) of every live rank on ``host`` at ``t``: what its probe sends, from its process."""
        out: list[tuple[int, FrHeads]] = []
        for gpu in host.gpus:
            if gpu.job is None or gpu.rank is None:
                continue
            heads = gpu.job.heads(gpu.rank, t, pid=gpu.pid)
            if heads is not None:
                out.append((gpu.pid, heads))
        return out

    def port_scan(self, host: HostSim, t: float) -> PortScan:
        """The host's IB ports at ``t``, as a sysfs read would find them."""
        return scan(host.ports, t)

    def iter_gpus(self) -> Iterator[GpuSim]:
        for host in self.hosts:
            yield from host.gpus


def sxid_lines(sxid: int, switch: int = 2, link: int = 30) -> list[str]:
    """A fatal SXid as the nvidia-nvswitch driver prints it: the event with its word, then its severity
    and data lines (the switch sits on a bus no simulated GPU uses)."""
    head = f"nvidia-nvswitch{switch}: SXid (PCI:0000:{SWITCH_BUS_BASE + switch:02x}:00.0)"
    return [
        f"{head}: {sxid}, Fatal, Link {link:02d} {SXID_TEXT.get(sxid, 'fatal switch error')}",
        f"{head}: {sxid}, Severity 1 Engine instance {link:02d} Sub-engine instance 00",
        f"{head}: {sxid}, Data {{0x{0x1000_0000 + link:08x}, 0x00000100, 0x00000000}}",
    ]


def _nic_bus(gpu_bus: str) -> str:
    """The HCA next to a GPU (``dddd:bb:dd`` → the next bus number, the same PCIe switch)."""
    domain, bus, device = gpu_bus.split(":")
    return f"{domain}:{(int(bus, 16) + 1) & 0xFF:02x}:{device}"

"""A small in-test GPU source and host boundaries (the simulated host lives in sentinel.sim)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import msgspec
import psutil

from sentinel.agent.jobs import ProcessHandle
from sentinel.agent.kmsg import KmsgRecord
from sentinel.agent.probe import Credentials
from sentinel.agent.source import GpuLostError, HostInputs, XidEvent, XidRecord
from sentinel.fr.heads import FrHeads
from sentinel.wire import EccCounters, GpuInfo, GpuSample, RowRemap


class FakeSource:
    """GpuSource with n healthy GPUs; ``lost`` GPUs raise, ``xids`` are handed out by wait_xid_events."""

    def __init__(self, gpus: int = 8) -> None:
        self.n = gpus
        self.lost: set[int] = set()
        self.pids: dict[int, list[int]] = {}
        self.xids: list[XidRecord] = []
        self._xid_ready = threading.Event()
        self.closed = False

    def open(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                index=i, uuid=f"GPU-fake-{i}", pci_bus=f"0000:{0x18 + 16 * i:02x}:00", name="Fake", nvlinks=0
            )
            for i in range(self.n)
        ]

    def read_fast(self, gpu: int, now: float) -> GpuSample:
        if gpu in self.lost:
            raise GpuLostError(f"GPU {gpu} lost")
        return GpuSample(
            gpu=gpu,
            t=now,
            util_gpu_pct=90.0,
            util_mem_pct=40.0,
            mem_used_bytes=1 << 30,
            mem_total_bytes=80 << 30,
            temp_c=60.0 + gpu,
            power_w=500.0,
            power_limit_w=700.0,
            sm_clock_mhz=1980.0,
            sm_clock_max_mhz=1980.0,
            mem_clock_mhz=2619.0,
            pstate=0,
            pcie_replay=0,
            pcie_tx_kbps=100.0,
            pcie_rx_kbps=200.0,
            pids=list(self.pids.get(gpu, [])),
        )

    def read_slow(self, gpu: int, now: float) -> GpuSample:
        sample = self.read_fast(gpu, now)
        sample.ecc = EccCounters(volatile_corrected=0, volatile_uncorrected=0)
        sample.remap = RowRemap()
        return sample

    def push_xid(self, gpu: int, xid: int, t: float) -> None:
        self.xids.append(XidRecord(gpu=gpu, xid=xid, t=t, text=f"Xid {xid}"))
        self._xid_ready.set()

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]:
        self._xid_ready.wait(timeout_s)
        self._xid_ready.clear()
        out: list[XidEvent] = list(self.xids)
        self.xids.clear()
        return out

    def close(self) -> None:
        self.closed = True


class FakeProcess:
    """A process as psutil shows it: its name, command line and environment."""

    def __init__(self, pid: int, environ: dict[str, str], name: str = "python") -> None:
        self.pid = pid
        self._environ = environ
        self._name = name

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return [self._name, "train.py"]

    def create_time(self) -> float:
        return 1000.0 + self.pid

    def environ(self) -> dict[str, str]:
        return dict(self._environ)

    def status(self) -> str:
        return str(psutil.STATUS_RUNNING)

    def parent(self) -> ProcessHandle | None:
        return None


@dataclass
class FakeHost:
    """A host's other OS boundaries, filled by a test: kmsg messages, job log lines, processes, probe heads.

    ``inputs()`` hands them to ``Agent(config, source, inputs)`` as kernel log records, tailed lines, a
    process table and probe datagrams (sent as ``uid``; root may speak for any job).
    """

    kernel: list[str] = field(default_factory=list)
    job_logs: list[str] = field(default_factory=list)
    procs: dict[int, FakeProcess] = field(default_factory=dict)
    heads: list[FrHeads] = field(default_factory=list)
    uid: int = 0

    def inputs(self) -> HostInputs:
        return HostInputs(
            kernel_log=_KernelLog(self),
            job_logs=_JobLogs(self),
            processes=_Processes(self),
            probe=_Probe(self),
        )


class _KernelLog:
    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.path = "fake kmsg"
        self.open_errors = 0
        self.is_open = True

    def poll(self, now: float) -> list[KmsgRecord]:
        out, self.host.kernel = self.host.kernel, []
        return [KmsgRecord(message=m, priority=4) for m in out]

    def save_cursor(self) -> None:
        pass

    def close(self) -> None:
        pass


class _JobLogs:
    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.cut_lines = 0
        self.refused_files = 0
        self.files = ["/fake/job.log"]

    def poll(self, now: float) -> list[tuple[str, str]]:
        out, self.host.job_logs = self.host.job_logs, []
        return [("/fake/job.log", line) for line in out]

    def close(self) -> None:
        pass


class _Processes:
    def __init__(self, host: FakeHost) -> None:
        self.host = host

    def process(self, pid: int) -> ProcessHandle:
        found = self.host.procs.get(pid)
        if found is None:
            raise psutil.NoSuchProcess(pid)
        return found

    def owner_uid(self, pid: int) -> int | None:
        return self.host.uid if pid in self.host.procs else None


class _Probe:
    def __init__(self, host: FakeHost) -> None:
        self.host = host

    def receive(self, now: float) -> list[tuple[bytes, Credentials | None]]:
        out, self.host.heads = self.host.heads, []
        uid = self.host.uid
        return [(msgspec.msgpack.encode(h), Credentials(pid=h.pid or 1, uid=uid, gid=uid)) for h in out]

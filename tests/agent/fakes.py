"""A small in-test GPU source and host extras (the simulated host lives in sentinel.sim)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sentinel.agent.source import GpuLostError, XidEvent, XidRecord
from sentinel.fr.heads import FrHeads
from sentinel.wire import EccCounters, GpuInfo, GpuSample, ProcInfo, RowRemap


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


@dataclass
class FakeExtras:
    kernel: list[str] = field(default_factory=list)
    job_logs: list[str] = field(default_factory=list)
    procs: list[ProcInfo] = field(default_factory=list)
    heads: list[FrHeads] = field(default_factory=list)

    def kernel_log_lines(self, now: float) -> list[str]:
        out, self.kernel = self.kernel, []
        return out

    def job_log_lines(self, now: float) -> list[str]:
        out, self.job_logs = self.job_logs, []
        return out

    def processes(self, now: float) -> list[ProcInfo]:
        return list(self.procs)

    def fr_heads(self, now: float) -> list[FrHeads]:
        out, self.heads = self.heads, []
        return out

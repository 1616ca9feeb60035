"""The one interface behind which the agent reads GPUs: real NVML or a simulated host.

Calls are blocking by design: NVML is a blocking C library, and a call can hang for minutes on a sick GPU.
The agent runs every call in a worker thread with a deadline, so neither a slow nor a hung call can block the
event loop or the other GPUs. Implementations raise :class:`GpuLostError` when the GPU has fallen off the
bus (NVML_ERROR_GPU_IS_LOST) and :class:`FieldNotSupported`-style gaps are expressed as ``None`` fields.

:class:`HostExtras` is what a simulated host provides in place of the other collectors (kernel log, NCCL
log files, the flight-recorder probe socket, /proc job mapping), so ``sentinel demo`` runs real agents on
simulated hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sentinel.components.nvml_read import GpuLostError
from sentinel.fr.heads import FrHeads
from sentinel.wire import EccCounters, GpuInfo, GpuSample, NvLink, ProcInfo, RetiredPages, RowRemap

__all__ = ["GpuLostError", "GpuSource", "HostExtras", "SlowReadings", "XidEvent", "XidRecord"]


class SlowReadings(Protocol):
    """Counters read on the slow cadence."""

    ecc: EccCounters | None
    remap: RowRemap | None
    retired: RetiredPages | None
    nvlink: list[NvLink] | None


class XidEvent(Protocol):
    """An Xid reported by the GPU source itself (NVML event set / simulator); read-only members."""

    @property
    def gpu(self) -> int: ...

    @property
    def xid(self) -> int: ...

    @property
    def t(self) -> float: ...

    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class XidRecord:
    """A concrete :class:`XidEvent`, for sources that have nothing richer to return."""

    gpu: int
    xid: int
    t: float
    text: str = ""


class GpuSource(Protocol):
    """A host's GPUs. All methods block; the agent calls them off the event loop with deadlines."""

    def open(self) -> list[GpuInfo]:
        """Initialise (nvmlInit) and return the inventory."""
        ...

    def read_fast(self, gpu: int, now: float) -> GpuSample:
        """Utilisation, memory, temperature, power, clocks, throttle reasons, pstate, PCIe, pids.

        Raise :class:`GpuLostError` when the GPU is gone; a call may also block forever (hung GPU): the agent
        then marks the GPU unresponsive and does not call it again until that call has returned.
        """
        ...

    def read_slow(self, gpu: int, now: float) -> GpuSample:
        """The fast fields plus ECC, row remapping, retired pages and NVLink counters."""
        ...

    def wait_xid_events(self, timeout_s: float) -> Sequence[XidEvent]:
        """Block up to ``timeout_s`` for Xid events on any GPU (nvmlEventSetWait)."""
        ...

    def close(self) -> None: ...


class HostExtras(Protocol):
    """Non-NVML inputs of a simulated host; each call returns what appeared since the last call.

    Given to :class:`sentinel.agent.Agent`, it replaces the kernel-log reader, the log-file tailer, the
    /proc job mapping and the probe socket. Kernel lines are kmsg *messages* (``NVRM: Xid (PCI:...): 79, ...``,
    without the ``pri,seq,ts;`` prefix); job log lines are NCCL/PyTorch log lines. Calls are made on the
    event loop, so they must not block.
    """

    def kernel_log_lines(self, now: float) -> list[str]: ...

    def job_log_lines(self, now: float) -> list[str]: ...

    def processes(self, now: float) -> list[ProcInfo]: ...

    def fr_heads(self, now: float) -> list[FrHeads]: ...

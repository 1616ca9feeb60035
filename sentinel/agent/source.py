"""The one interface behind which the agent reads GPUs: real NVML or a simulated host.

Calls are blocking by design: NVML is a blocking C library, and a call can hang for minutes on a sick GPU.
The agent runs every call in a worker thread with a deadline, so neither a slow nor a hung call can block the
event loop or the other GPUs. Implementations raise :class:`GpuLostError` when the GPU has fallen off the
bus (NVML_ERROR_GPU_IS_LOST) and :class:`FieldNotSupported`-style gaps are expressed as ``None`` fields.

:class:`HostInputs` is what a simulated host offers at the other OS boundaries (kernel log records, job log
lines, the process table, probe datagrams, IB ports), so ``sentinel sim``, ``sentinel demo`` and
``sentinel agent run --simulate`` run the real collectors on simulated hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sentinel.components.nvml_read import GpuLostError
from sentinel.wire import EccCounters, GpuInfo, GpuSample, NvLink, RetiredPages, RowRemap

if TYPE_CHECKING:  # the collectors these feed import this module
    from sentinel.agent.jobs import ProcessTable
    from sentinel.agent.kmsg import KmsgRecord
    from sentinel.agent.probe import Credentials
    from sentinel.components.fabric.manager import UnitReader
    from sentinel.components.ib.sysfs import PortSource

__all__ = [
    "DatagramFeed",
    "GpuLostError",
    "GpuSource",
    "HostInputs",
    "KernelLog",
    "LogLines",
    "SlowReadings",
    "XidEvent",
    "XidRecord",
]


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
    """A host's GPUs. All methods block; the agent calls them off the event loop with deadlines (an inline
    agent, under ``sentinel sim``'s virtual clock, calls them in place: a simulated source then raises
    :class:`sentinel.agent.worker.CallBlocks` where a real call would hang)."""

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


class KernelLog(Protocol):
    """Where kernel log records come from: ``/dev/kmsg``, journald, or a simulated host's kernel ring.

    ``poll`` never blocks and returns the records logged since the last call, as
    :func:`sentinel.agent.kmsg.parse_kmsg_record` makes them.
    """

    path: str
    open_errors: int

    @property
    def is_open(self) -> bool: ...

    def poll(self, now: float) -> list[KmsgRecord]: ...

    def save_cursor(self) -> None: ...

    def close(self) -> None: ...


class LogLines(Protocol):
    """Where job log lines come from: the log-file tailer, or a simulated host's rank logs.

    ``poll`` returns ``(path, line)`` for every complete line appended since the last call.
    """

    cut_lines: int
    refused_files: int  # paths not followed: symbolic links, not regular files

    @property
    def files(self) -> list[str]: ...

    def poll(self, now: float) -> list[tuple[str, str]]: ...

    def close(self) -> None: ...


class DatagramFeed(Protocol):
    """Datagrams a simulated probe socket received since the last call, each with its sender's credentials.

    The real socket is read by :class:`sentinel.agent.probe.ProbeServer` on the event loop; a simulated host
    hands over the same bytes (msgpack FrHeads) and the same kernel-attested sender, and the server
    validates and authorises them exactly as it does a socket's.
    """

    def receive(self, now: float) -> list[tuple[bytes, Credentials | None]]: ...


@dataclass(frozen=True)
class HostInputs:
    """Where an agent reads its host from when that is not the machine it runs on (a simulated host).

    Each field replaces one OS boundary and nothing above it: the real collectors, line classifier, Xid
    merge, job mapper, probe validation and batch builder run on what these return. ``None`` keeps the
    host's own (``/dev/kmsg``, the log tailer, ``/proc``, the probe socket, sysfs).
    """

    kernel_log: KernelLog | None = None
    job_logs: LogLines | None = None
    processes: ProcessTable | None = None
    probe: DatagramFeed | None = None
    ib_ports: PortSource | None = None
    #: the fabric manager's ``systemctl show`` answers (a simulated host's)
    fabric_manager: UnitReader | None = None
    #: the host's ``/proc/sys/kernel/random/boot_id`` (each simulated host boots on its own)
    boot_id: str | None = None
    #: a simulated host runs no PyTorch ranks, so ``fr_dump`` answers that there is nothing to dump
    simulated: bool = False

"""The real GPU source: NVML through nvidia-ml-py (``pynvml``).

Every read goes through :meth:`NvmlSource._get`, which turns NVML's error model into the agent's:

- ``NOT_SUPPORTED`` (and a function missing from an older driver) is remembered per (GPU, field) and that
  field is not asked again: some GPUs answer NOT_SUPPORTED slowly, and asking 20 of them every second is
  wasted driver time;
- ``GPU_IS_LOST`` raises :class:`GpuLostError` so the agent marks the GPU lost;
- anything else is reported to ``on_error(function, error)`` (a metric) and the field is left empty.

All methods block; the agent runs them in per-GPU worker threads with deadlines.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from sentinel.agent.source import GpuLostError, XidEvent, XidRecord
from sentinel.wire import EccCounters, GpuInfo, GpuSample, NvLink, RetiredPages, RowRemap

ErrorHook = Callable[[str, str], None]

#: clock-event (throttle) reason bits → the names of /work/notes/metrics.md
THROTTLE_REASONS: dict[int, str] = {
    0x0000000000000001: "gpu_idle",
    0x0000000000000002: "applications_clocks",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000010: "sync_boost",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
    0x0000000000000100: "display_clocks",
}

RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
_XID_EVENT = pynvml.nvmlEventTypeXidCriticalError
_FI_RECOVERY_ACTION = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
_MAX_LINKS = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))


class _Unsupported(Exception):
    """Internal: the field is not supported on this GPU."""


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _pointer_value(handle: Any) -> int:
    """The address an NVML handle (a ctypes pointer) holds, to recognise it in event data."""
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value or 0)


def normalize_pci_bus(bus_id: str) -> str:
    """NVML's ``00000000:1B:00.0`` → the contract's ``0000:1b:00`` (4-digit domain, no function, lower)."""
    text = bus_id.strip().lower()
    if "." in text:
        text = text.rsplit(".", 1)[0]
    parts = text.split(":")
    if len(parts) == 3:
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1][-2:].rjust(2, '0')}:{parts[2][-2:].rjust(2, '0')}"
    return text


class NvmlSource:
    """:class:`sentinel.agent.source.GpuSource` over NVML."""

    def __init__(self, on_error: ErrorHook | None = None, *, max_links: int = _MAX_LINKS) -> None:
        self._on_error = on_error
        self._max_links = max_links
        self._handles: list[Any] = []
        self._handle_index: dict[int, int] = {}
        self._links: dict[int, list[int]] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._initialised = False

    # -- error model ---------------------------------------------------------------------------------------

    def unsupported(self) -> set[tuple[int, str]]:
        """(GPU, field) pairs known to be NOT_SUPPORTED (for tests and ``sentinel agent once``)."""
        with self._lock:
            return set(self._unsupported)

    def _get(self, gpu: int, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn``; None when unsupported (remembered) or failing; GpuLostError when the GPU is gone."""
        key = (gpu, field)
        if key in self._unsupported:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                with self._lock:
                    self._unsupported.add(key)
                return None
            if code == _GPU_IS_LOST:
                raise GpuLostError(f"GPU {gpu}: {fn.__name__}: GPU is lost") from None
            self._report(fn.__name__, exc)
            return None
        except pynvml.NVMLLibraryMismatchError:
            with self._lock:
                self._unsupported.add(key)
            return None
        except _Unsupported:
            with self._lock:
                self._unsupported.add(key)
            return None

    def _report(self, function: str, exc: BaseException) -> None:
        if self._on_error is not None:
            code = getattr(exc, "value", None)
            name = type(exc).__name__.removeprefix("NVMLError_") if code is not None else "exception"
            self._on_error(function, name.lower())

    # -- GpuSource ---------------------------------------------------------------------------------------

    def open(self) -> list[GpuInfo]:
        if not self._initialised:
            pynvml.nvmlInit()
            self._initialised = True
        driver = _text(self._get(-1, "driver", pynvml.nvmlSystemGetDriverVersion) or "")
        count = int(pynvml.nvmlDeviceGetCount())
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._handle_index = {_pointer_value(h): i for i, h in enumerate(self._handles)}
        inventory: list[GpuInfo] = []
        for index, handle in enumerate(self._handles):
            inventory.append(self._identity(index, handle, driver))
        self._setup_events()
        return inventory

    def _identity(self, index: int, handle: Any, driver: str) -> GpuInfo:
        try:
            uuid = _text(self._get(index, "uuid", pynvml.nvmlDeviceGetUUID, handle) or "")
            pci = self._get(index, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
            name = _text(self._get(index, "name", pynvml.nvmlDeviceGetName, handle) or "")
            serial = _text(self._get(index, "serial", pynvml.nvmlDeviceGetSerial, handle) or "")
            vbios = _text(self._get(index, "vbios", pynvml.nvmlDeviceGetVbiosVersion, handle) or "")
            memory = self._get(index, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
            links = self._probe_links(index, handle)
        except GpuLostError:
            return GpuInfo(index=index, uuid="", pci_bus="", driver=driver)
        pci_bus = normalize_pci_bus(_text(pci.busId)) if pci is not None else ""
        self._links[index] = links
        return GpuInfo(
            index=index,
            uuid=uuid,
            pci_bus=pci_bus,
            name=name,
            serial=serial,
            driver=driver,
            vbios=vbios,
            memory_total_bytes=int(memory.total) if memory is not None else 0,
            nvlinks=len(links),
        )

    def _probe_links(self, index: int, handle: Any) -> list[int]:
        """Links that exist: NVML answers NOT_SUPPORTED / INVALID_ARGUMENT for the others."""
        links: list[int] = []
        for link in range(self._max_links):
            try:
                pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) == _GPU_IS_LOST:
                    raise GpuLostError(f"GPU {index}: GPU is lost") from None
                if getattr(exc, "value", None) in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND) and link == 0:
                    break
                continue
            links.append(link)
        return links

    def _setup_events(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._report("nvmlEventSetCreate", exc)
            return
        registered = 0
        for index, handle in enumerate(self._handles):
            try:
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                if supported & _XID_EVENT:
                    pynvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, event_set)
                    registered += 1
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) not in (_NOT_SUPPORTED, _GPU_IS_LOST):
                    self._report("nvmlDeviceRegisterEvents", exc)
                del index
        if registered:
            self._event_set = event_set
        else:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)

    def _handle(self, gpu: int) -> Any:
        if not 0 <= gpu < len(self._handles):
            raise GpuLostError(f"GPU {gpu}: no such GPU")
        return self._handles[gpu]

    def read_fast(self, gpu: int, now: float) -> GpuSample:
        h = self._handle(gpu)
        get = self._get
        sample = GpuSample(gpu=gpu, t=now)
        util = get(gpu, "utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            sample.util_gpu_pct = float(util.gpu)
            sample.util_mem_pct = float(util.memory)
        memory = get(gpu, "memory", pynvml.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:
            sample.mem_used_bytes = int(memory.used)
            sample.mem_total_bytes = int(memory.total)
        temp = get(gpu, "temperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        sample.temp_c = float(temp) if temp is not None else None
        power = get(gpu, "power", pynvml.nvmlDeviceGetPowerUsage, h)
        sample.power_w = power / 1000.0 if power is not None else None
        limit = get(gpu, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        sample.power_limit_w = limit / 1000.0 if limit is not None else None
        sm = get(gpu, "sm_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        sample.sm_clock_mhz = float(sm) if sm is not None else None
        sm_max = get(gpu, "sm_clock_max", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
        sample.sm_clock_max_mhz = float(sm_max) if sm_max is not None else None
        mem_clock = get(gpu, "mem_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        sample.mem_clock_mhz = float(mem_clock) if mem_clock is not None else None
        reasons = get(gpu, "clock_events", self._clock_event_reasons, h)
        if reasons is not None:
            sample.throttle = [name for bit, name in THROTTLE_REASONS.items() if reasons & bit]
        pstate = get(gpu, "pstate", pynvml.nvmlDeviceGetPerformanceState, h)
        sample.pstate = int(pstate) if pstate is not None and 0 <= int(pstate) <= 15 else None
        replay = get(gpu, "pcie_replay", pynvml.nvmlDeviceGetPcieReplayCounter, h)
        sample.pcie_replay = int(replay) if replay is not None else None
        tx = get(gpu, "pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        sample.pcie_tx_kbps = float(tx) if tx is not None else None
        rx = get(gpu, "pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        sample.pcie_rx_kbps = float(rx) if rx is not None else None
        procs = get(gpu, "processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is not None:
            sample.pids = sorted({int(p.pid) for p in procs})
        return sample

    @staticmethod
    def _clock_event_reasons(handle: Any) -> int:
        """Newer drivers name them clock events; older ones only have the throttle-reason function."""
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) != _FUNCTION_NOT_FOUND:
                raise
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def read_slow(self, gpu: int, now: float) -> GpuSample:
        sample = self.read_fast(gpu, now)
        h = self._handle(gpu)
        sample.ecc = self._ecc(gpu, h)
        sample.remap = self._remap(gpu, h)
        sample.retired = self._retired(gpu, h)
        sample.nvlink = self._nvlink(gpu, h)
        sample.recovery_action = self._get(gpu, "recovery_action", self._recovery_action, h)
        return sample

    def _ecc(self, gpu: int, h: Any) -> EccCounters | None:
        get = self._get
        fn = pynvml.nvmlDeviceGetTotalEccErrors
        corrected, uncorrected = (
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        )
        volatile, aggregate = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
        values = {
            "volatile_corrected": get(gpu, "ecc_vc", fn, h, corrected, volatile),
            "volatile_uncorrected": get(gpu, "ecc_vu", fn, h, uncorrected, volatile),
            "aggregate_corrected": get(gpu, "ecc_ac", fn, h, corrected, aggregate),
            "aggregate_uncorrected": get(gpu, "ecc_au", fn, h, uncorrected, aggregate),
        }
        location = pynvml.nvmlDeviceGetMemoryErrorCounter
        values["sram_uncorrected"] = get(
            gpu, "ecc_sram", location, h, uncorrected, aggregate, pynvml.NVML_MEMORY_LOCATION_SRAM
        )
        values["dram_uncorrected"] = get(
            gpu, "ecc_dram", location, h, uncorrected, aggregate, pynvml.NVML_MEMORY_LOCATION_DRAM
        )
        if all(v is None for v in values.values()):
            return None
        return EccCounters(**{k: int(v) for k, v in values.items() if v is not None})

    def _remap(self, gpu: int, h: Any) -> RowRemap | None:
        rows = self._get(gpu, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows, h)
        if rows is None:
            return None
        correctable, uncorrectable, pending, failure = rows
        hist = self._get(gpu, "remap_histogram", pynvml.nvmlDeviceGetRowRemapperHistogram, h)
        extra: dict[str, int] = {}
        if hist is not None:
            extra = {
                "hist_max": int(hist.max),
                "hist_high": int(hist.high),
                "hist_partial": int(hist.partial),
                "hist_low": int(hist.low),
                "hist_none": int(hist.none),
            }
        return RowRemap(
            correctable=int(correctable),
            uncorrectable=int(uncorrectable),
            pending=bool(pending),
            failure=bool(failure),
            **extra,
        )

    def _retired(self, gpu: int, h: Any) -> RetiredPages | None:
        fn = pynvml.nvmlDeviceGetRetiredPages
        single = self._get(
            gpu, "retired_sbe", fn, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        double = self._get(gpu, "retired_dbe", fn, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = self._get(gpu, "retired_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if single is None and double is None and pending is None:
            return None
        return RetiredPages(
            single_bit=len(single or []), double_bit=len(double or []), pending=bool(pending or 0)
        )

    def _nvlink(self, gpu: int, h: Any) -> list[NvLink] | None:
        links = self._links.get(gpu) or []
        if not links:
            return None
        out: list[NvLink] = []
        counter = pynvml.nvmlDeviceGetNvLinkErrorCounter
        for link in links:
            state = self._get(gpu, f"nvlink{link}_state", pynvml.nvmlDeviceGetNvLinkState, h, link)
            crc = self._get(gpu, f"nvlink{link}_crc", counter, h, link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
            replay = self._get(
                gpu, f"nvlink{link}_replay", counter, h, link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY
            )
            recovery = self._get(
                gpu, f"nvlink{link}_recovery", counter, h, link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY
            )
            out.append(
                NvLink(
                    link=link,
                    active=bool(state) if state is not None else False,
                    crc_errors=int(crc or 0),
                    replay_errors=int(replay or 0),
                    recovery_errors=int(recovery or 0),
                )
            )
        return out

    @staticmethod
    def _recovery_action(h: Any) -> str:
        values = pynvml.nvmlDeviceGetFieldValues(h, [_FI_RECOVERY_ACTION])
        value = values[0]
        if int(value.nvmlReturn) != pynvml.NVML_SUCCESS:
            if int(value.nvmlReturn) == _GPU_IS_LOST:
                raise pynvml.NVMLError(_GPU_IS_LOST)
            raise _Unsupported
        code = int(value.value.uiVal)
        return RECOVERY_ACTIONS.get(code, f"unknown_{code}")

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]:
        if self._event_set is None:
            time.sleep(timeout_s)
            return []
        try:
            data = pynvml.nvmlEventSetWait(self._event_set, max(1, int(timeout_s * 1000)))
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) != _TIMEOUT:
                self._report("nvmlEventSetWait", exc)
                time.sleep(min(timeout_s, 1.0))
            return []
        if not int(data.eventType) & _XID_EVENT:
            return []
        gpu = self._handle_index.get(_pointer_value(data.device), -1)
        xid = int(data.eventData)
        return [XidRecord(gpu=gpu, xid=xid, t=time.time(), text=f"NVML Xid {xid} on GPU {gpu}")]

    def close(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        if self._initialised:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            self._initialised = False

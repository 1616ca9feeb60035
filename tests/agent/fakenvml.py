"""A fake NVML at the library boundary: ctypes callbacks installed as pynvml's ``nvmlLib``.

pynvml looks every C function up with ``getattr(nvmlLib, name)`` and calls it with ctypes arguments
(``byref`` structs, ``c_uint`` enums, string buffers). Here each such function is a ``CFUNCTYPE`` callback
with the C signature, so nvidia-ml-py's own marshalling, struct layouts, error-code mapping and version
fallbacks all run exactly as against libnvidia-ml.so — only the driver behind them is simulated.

Per GPU the fake can answer NOT_SUPPORTED for chosen functions, answer GPU_IS_LOST for everything, or
block inside a call until released (a hung GPU). A GPU can be unbound (every call and its handle answer
GPU_IS_LOST) and rebound (a new handle; the old one answers a chosen error, as a real driver's stale
handle does). A function can be left out, as an older library lacks it. Xid events are queued into the
event set.
"""

from __future__ import annotations

import ctypes
import importlib
import pkgutil
import queue
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from ctypes import CFUNCTYPE, c_int, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

P = c_void_p
#: defines one device function of the fake: ``device(name, body, *argtypes)``, ``body(gpu, *args) -> code``
Device = Callable[..., Any]
COMPONENT_TESTS = Path(__file__).resolve().parents[1] / "components"
SUCCESS = 0
NOT_SUPPORTED = 3
FUNCTION_NOT_FOUND = 13
INSUFFICIENT_SIZE = 7
TIMEOUT = 10
GPU_IS_LOST = 15
HANDLE_BASE = 0x1000
#: a handle is HANDLE_BASE + binding * HANDLE_STRIDE + index: a rebound GPU's handle is a new one
HANDLE_STRIDE = 0x100
EVENT_SET = 0xE000


@dataclass
class FakeGpu:
    index: int
    uuid: str = ""
    bus_id: str = ""
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1650923000000"
    vbios: str = "96.00.99.00.01"
    util_gpu: int = 87
    util_mem: int = 41
    mem_total: int = 80 * 1024**3
    mem_used: int = 60 * 1024**3
    temp: int = 64
    power_mw: int = 612_345
    limit_mw: int = 700_000
    sm_clock: int = 1980
    sm_clock_max: int = 1980
    mem_clock: int = 2619
    reasons: int = 0
    pstate: int = 0
    pcie_replay: int = 3
    pcie_tx_kb: int = 1200
    pcie_rx_kb: int = 3400
    pids: list[int] = field(default_factory=list)
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type) -> count
    ecc_location: dict[int, int] = field(default_factory=dict)  # location -> aggregate uncorrected
    remap: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failure
    histogram: tuple[int, int, int, int, int] = (640, 0, 0, 0, 0)
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    nvlinks: dict[int, bool] = field(default_factory=lambda: {0: True, 1: True})
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter) -> count
    #: ``hopper``: NVLink data-link CRC/replay/recovery counters (nvmlDeviceGetNvLinkErrorCounter and the
    #: DL field ids); ``blackwell``: those answer NOT_SUPPORTED, the symbol/effective-error and BER fields
    #: answer instead (what R570+ drivers do on B200/GB200)
    generation: str = "hopper"
    #: Blackwell NVLink fields: (field id, link) -> raw value (BER fields hold NVML's mantissa/exponent code)
    nvlink_fields: dict[tuple[int, int], int] = field(default_factory=dict)
    #: nvmlDeviceGetViolationStatus: perf policy -> cumulative violation ns; a policy absent: NOT_SUPPORTED
    violations: dict[int, int] = field(
        default_factory=lambda: {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 10: 0, 11: 0}
    )
    recovery_action: int | None = 0  # None: field not supported
    mem_temp: int | None = 71  # HBM temperature field; None: not supported
    pcie_gen: tuple[int, int] = (5, 5)  # (now, max)
    pcie_width: tuple[int, int] = (16, 16)
    fabric: tuple[int, int, int] | None = None  # (state, status, clique); None: NOT_SUPPORTED (no NVSwitch)
    unsupported: set[str] = field(default_factory=set)  # NVML function names answering NOT_SUPPORTED
    #: what the components' own fake functions answer, by name (``tests/components/<name>/fake_nvml.py``)
    extra: dict[str, Any] = field(default_factory=dict)
    lost: bool = False
    #: nvmlDeviceGetHandleByIndex answers this NVML error code for this GPU (0: it opens)
    handle_error: int = 0
    #: every call on the opened GPU answers this NVML error code (999 UNKNOWN: a driver that serves nothing on
    #: it); 0: normal
    failing: int = 0
    hang: threading.Event | None = None  # given and not set: every call blocks until it is set (released)
    #: unbound from the driver: its handle and every call on it answer GPU_IS_LOST
    unbound: bool = False
    #: bumped by a rebind: handles of earlier bindings are stale and answer ``stale_error``
    binding: int = 0
    stale_error: int = 2  # INVALID_ARGUMENT

    @property
    def handle(self) -> int:
        return HANDLE_BASE + self.binding * HANDLE_STRIDE + self.index

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-{self.index:08x}-0000-0000-0000-000000000000"
        if not self.bus_id:
            self.bus_id = f"00000000:{0x18 + self.index * 0x10:02X}:00.0"


_CRC_DATA_FIELDS = [
    *range(
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0,
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L5 + 1,
    ),
    *range(
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6,
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L11 + 1,
    ),
]
_BER_FIELDS = frozenset(
    {pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER}
)
_BLACKWELL_FIELDS = _BER_FIELDS | {
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
}


def _put_uint(address: int, value: int) -> None:
    c_uint.from_address(address).value = value


def _put_ull(address: int, value: int) -> None:
    c_ulonglong.from_address(address).value = value


def _put_str(address: int, text: str, size: int) -> None:
    data = text.encode()[: size - 1] + b"\0"
    ctypes.memmove(address, data, len(data))


class FakeNvml:
    """The fake library; ``install(monkeypatch)`` makes pynvml use it."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "550.54.15") -> None:
        self.gpus = gpus
        self.driver = driver
        self.calls: Counter[tuple[int, str]] = Counter()
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.hang_entered = threading.Event()
        #: nvmlInit answers this error code (e.g. 9 DRIVER_NOT_LOADED); 0: it loads
        self.init_error = 0
        #: every device call answers this error code (e.g. 1 UNINITIALIZED after a driver reload); 0: normal
        self.down = 0
        self.inits = 0
        #: the CPU timestamp (µs) NVML stamps violation readings with; None: the real clock
        self.now_us: int | None = None
        #: every nvmlDeviceGetFieldValues call: (GPU, [(field id, scope id), ...]) as the caller filled them
        self.field_calls: list[tuple[int, list[tuple[int, int]]]] = []
        self._keep: list[Any] = []
        self.lib = self._build()

    def install(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(pynvml, "nvmlLib", self.lib)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})

    def unbind(self, index: int) -> None:
        """The GPU leaves the driver (``echo ... > unbind``): everything about it answers GPU_IS_LOST."""
        self.gpus[index].unbound = True

    def rebind(self, index: int, stale_error: int = 2, uuid: str = "") -> None:
        """The GPU is bound again: a new handle by index; the old one answers ``stale_error`` (a real driver
        answers INVALID_ARGUMENT, GPU_IS_LOST or UNINITIALIZED there). ``uuid``: another GPU came back."""
        gpu = self.gpus[index]
        gpu.unbound, gpu.binding, gpu.stale_error = False, gpu.binding + 1, stale_error
        if uuid:
            gpu.uuid = uuid

    def without(self, *functions: str) -> None:
        """An older library: these functions are not in it (pynvml answers FUNCTION_NOT_FOUND)."""
        for name in functions:
            delattr(self.lib, name)

    def push_xid(self, gpu: int, xid: int) -> None:
        self.events.put((gpu, xid))

    # -- field values ---------------------------------------------------------------------------------------

    def _field(self, gpu: FakeGpu, field_id: int, scope: int) -> tuple[int, int] | int:
        """(valueType, value) for one field of one GPU, or the negated NVML error this value answers."""
        ull, uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return (uint, gpu.recovery_action) if gpu.recovery_action is not None else -NOT_SUPPORTED
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return (uint, gpu.mem_temp) if gpu.mem_temp is not None else -NOT_SUPPORTED
        dl = {
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        }
        if field_id in dl:  # scoped: the scope id is the link
            if gpu.generation == "blackwell":
                return -NOT_SUPPORTED
            if scope not in gpu.nvlinks:
                return -2  # INVALID_ARGUMENT: no such link
            return ull, gpu.nvlink_errors.get((scope, dl[field_id]), 0)
        if field_id in _CRC_DATA_FIELDS:  # one field id per link, links 0-11
            link = _CRC_DATA_FIELDS.index(field_id)
            if gpu.generation == "blackwell":
                return -NOT_SUPPORTED
            if link not in gpu.nvlinks:
                return -2
            return ull, gpu.nvlink_errors.get((link, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA), 0)
        if field_id in _BLACKWELL_FIELDS:
            if gpu.generation != "blackwell":
                return -NOT_SUPPORTED
            if scope not in gpu.nvlinks:
                return -2
            kind = uint if field_id in _BER_FIELDS else ull
            return kind, gpu.nvlink_fields.get((field_id, scope), 0)
        return -NOT_SUPPORTED

    # -- plumbing -------------------------------------------------------------------------------------------

    def _device(self, name: str, body: Callable[..., int], *argtypes: Any) -> Any:
        def call(handle: int | None, *args: Any) -> int:
            binding, index = divmod((handle or 0) - HANDLE_BASE, HANDLE_STRIDE)
            if not 0 <= index < len(self.gpus) or binding < 0:
                return 2  # INVALID_ARGUMENT
            gpu = self.gpus[index]
            self.calls[(index, name)] += 1
            if self.down:
                return self.down
            if gpu.unbound:
                return GPU_IS_LOST
            if binding != gpu.binding:
                return gpu.stale_error
            if gpu.hang is not None and not gpu.hang.is_set():
                self.hang_entered.set()
                gpu.hang.wait()
            if gpu.lost:
                return GPU_IS_LOST
            if gpu.failing:
                return gpu.failing
            if name in gpu.unsupported:
                return NOT_SUPPORTED
            return body(gpu, *args)

        return self._cfunc(call, P, *argtypes)

    def _cfunc(self, fn: Callable[..., int], *argtypes: Any) -> Any:
        cb = CFUNCTYPE(c_int, *argtypes)(fn)
        self._keep.append(cb)
        return cb

    def _build(self) -> types.SimpleNamespace:
        lib = types.SimpleNamespace()
        d = self._device

        def string(getter: Callable[[FakeGpu], str]) -> Callable[..., int]:
            def body(gpu: FakeGpu, buf: int, size: int) -> int:
                _put_str(buf, getter(gpu), size)
                return SUCCESS

            return body

        def uint(getter: Callable[[FakeGpu], int]) -> Callable[..., int]:
            def body(gpu: FakeGpu, out: int) -> int:
                _put_uint(out, getter(gpu))
                return SUCCESS

            return body

        def init(flags: int) -> int:
            self.inits += 1
            if not self.init_error:
                self.down = 0  # a successful init after a driver reload: the library works again
            return self.init_error

        lib.nvmlInitWithFlags = self._cfunc(init, c_uint)
        lib.nvmlShutdown = self._cfunc(lambda: SUCCESS)

        def driver(buf: int, size: int) -> int:
            _put_str(buf, self.driver, size)
            return SUCCESS

        lib.nvmlSystemGetDriverVersion = self._cfunc(driver, P, c_uint)

        def count(out: int) -> int:
            _put_uint(out, len(self.gpus))
            return SUCCESS

        lib.nvmlDeviceGetCount_v2 = self._cfunc(count, P)

        def handle(index: int, out: int) -> int:
            if index >= len(self.gpus):
                return 2
            if self.gpus[index].handle_error:
                return self.gpus[index].handle_error
            if self.gpus[index].unbound:
                return GPU_IS_LOST
            c_void_p.from_address(out).value = self.gpus[index].handle
            return SUCCESS

        lib.nvmlDeviceGetHandleByIndex_v2 = self._cfunc(handle, c_uint, P)
        lib.nvmlDeviceGetUUID = d("nvmlDeviceGetUUID", string(lambda g: g.uuid), P, c_uint)
        lib.nvmlDeviceGetName = d("nvmlDeviceGetName", string(lambda g: g.name), P, c_uint)
        lib.nvmlDeviceGetSerial = d("nvmlDeviceGetSerial", string(lambda g: g.serial), P, c_uint)
        lib.nvmlDeviceGetVbiosVersion = d("nvmlDeviceGetVbiosVersion", string(lambda g: g.vbios), P, c_uint)

        def pci(gpu: FakeGpu, out: int) -> int:
            info = pynvml.nvmlPciInfo_t.from_address(out)
            info.busId = gpu.bus_id.encode()
            info.busIdLegacy = gpu.bus_id.encode()[:15]
            return SUCCESS

        lib.nvmlDeviceGetPciInfo_v3 = d("nvmlDeviceGetPciInfo_v3", pci, P)

        def memory(gpu: FakeGpu, out: int) -> int:
            m = pynvml.c_nvmlMemory_t.from_address(out)
            m.total, m.used, m.free = gpu.mem_total, gpu.mem_used, gpu.mem_total - gpu.mem_used
            return SUCCESS

        lib.nvmlDeviceGetMemoryInfo = d("nvmlDeviceGetMemoryInfo", memory, P)

        def util(gpu: FakeGpu, out: int) -> int:
            u = pynvml.c_nvmlUtilization_t.from_address(out)
            u.gpu, u.memory = gpu.util_gpu, gpu.util_mem
            return SUCCESS

        lib.nvmlDeviceGetUtilizationRates = d("nvmlDeviceGetUtilizationRates", util, P)

        def temperature(gpu: FakeGpu, sensor: int, out: int) -> int:
            _put_uint(out, gpu.temp)
            return SUCCESS

        lib.nvmlDeviceGetTemperature = d("nvmlDeviceGetTemperature", temperature, c_uint, P)

        lib.nvmlDeviceGetPowerUsage = d("nvmlDeviceGetPowerUsage", uint(lambda g: g.power_mw), P)
        lib.nvmlDeviceGetEnforcedPowerLimit = d(
            "nvmlDeviceGetEnforcedPowerLimit", uint(lambda g: g.limit_mw), P
        )

        def clock(gpu: FakeGpu, kind: int, out: int) -> int:
            _put_uint(out, gpu.sm_clock if kind == pynvml.NVML_CLOCK_SM else gpu.mem_clock)
            return SUCCESS

        def max_clock(gpu: FakeGpu, kind: int, out: int) -> int:
            _put_uint(out, gpu.sm_clock_max)
            return SUCCESS

        lib.nvmlDeviceGetClockInfo = d("nvmlDeviceGetClockInfo", clock, c_uint, P)
        lib.nvmlDeviceGetMaxClockInfo = d("nvmlDeviceGetMaxClockInfo", max_clock, c_uint, P)

        def reasons(gpu: FakeGpu, out: int) -> int:
            _put_ull(out, gpu.reasons)
            return SUCCESS

        lib.nvmlDeviceGetCurrentClocksEventReasons = d("nvmlDeviceGetCurrentClocksEventReasons", reasons, P)
        lib.nvmlDeviceGetPerformanceState = d("nvmlDeviceGetPerformanceState", uint(lambda g: g.pstate), P)
        lib.nvmlDeviceGetPcieReplayCounter = d(
            "nvmlDeviceGetPcieReplayCounter", uint(lambda g: g.pcie_replay), P
        )

        def throughput(gpu: FakeGpu, counter: int, out: int) -> int:
            _put_uint(out, gpu.pcie_tx_kb if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kb)
            return SUCCESS

        lib.nvmlDeviceGetPcieThroughput = d("nvmlDeviceGetPcieThroughput", throughput, c_uint, P)

        def processes(gpu: FakeGpu, count_out: int, array: int | None) -> int:
            have = c_uint.from_address(count_out).value
            if array is None or have < len(gpu.pids):
                _put_uint(count_out, len(gpu.pids))
                return INSUFFICIENT_SIZE if gpu.pids else SUCCESS
            size = ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t)
            for i, pid in enumerate(gpu.pids):
                info = pynvml.c_nvmlProcessInfo_v3_t.from_address(array + i * size)
                info.pid, info.usedGpuMemory = pid, 1 << 30
            _put_uint(count_out, len(gpu.pids))
            return SUCCESS

        lib.nvmlDeviceGetComputeRunningProcesses_v3 = d(
            "nvmlDeviceGetComputeRunningProcesses_v3", processes, P, P
        )

        def total_ecc(gpu: FakeGpu, error_type: int, counter_type: int, out: int) -> int:
            _put_ull(out, gpu.ecc.get((error_type, counter_type), 0))
            return SUCCESS

        lib.nvmlDeviceGetTotalEccErrors = d("nvmlDeviceGetTotalEccErrors", total_ecc, c_uint, c_uint, P)

        def ecc_location(gpu: FakeGpu, error_type: int, counter_type: int, location: int, out: int) -> int:
            if location not in gpu.ecc_location:
                return NOT_SUPPORTED
            _put_ull(out, gpu.ecc_location[location])
            return SUCCESS

        lib.nvmlDeviceGetMemoryErrorCounter = d(
            "nvmlDeviceGetMemoryErrorCounter", ecc_location, c_uint, c_uint, c_uint, P
        )

        def remapped(gpu: FakeGpu, corr: int, unc: int, pending: int, failure: int) -> int:
            for address, value in zip((corr, unc, pending, failure), gpu.remap, strict=True):
                _put_uint(address, value)
            return SUCCESS

        lib.nvmlDeviceGetRemappedRows = d("nvmlDeviceGetRemappedRows", remapped, P, P, P, P)

        def histogram(gpu: FakeGpu, out: int) -> int:
            h = pynvml.c_nvmlRowRemapperHistogramValues.from_address(out)
            h.max, h.high, h.partial, h.low, h.none = gpu.histogram
            return SUCCESS

        lib.nvmlDeviceGetRowRemapperHistogram = d("nvmlDeviceGetRowRemapperHistogram", histogram, P)

        def retired(gpu: FakeGpu, cause: int, count_out: int, pages: int | None) -> int:
            wanted = (
                gpu.retired_dbe
                if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                else gpu.retired_sbe
            )
            if pages is None or c_uint.from_address(count_out).value < len(wanted):
                _put_uint(count_out, len(wanted))
                return INSUFFICIENT_SIZE if wanted else SUCCESS
            for i, page in enumerate(wanted):
                _put_ull(pages + 8 * i, page)
            _put_uint(count_out, len(wanted))
            return SUCCESS

        lib.nvmlDeviceGetRetiredPages = d("nvmlDeviceGetRetiredPages", retired, c_uint, P, P)
        lib.nvmlDeviceGetRetiredPagesPendingStatus = d(
            "nvmlDeviceGetRetiredPagesPendingStatus", uint(lambda g: g.retired_pending), P
        )

        def link_state(gpu: FakeGpu, link: int, out: int) -> int:
            if link not in gpu.nvlinks:
                return 2  # INVALID_ARGUMENT, as NVML answers for a link that does not exist
            _put_uint(out, 1 if gpu.nvlinks[link] else 0)
            return SUCCESS

        lib.nvmlDeviceGetNvLinkState = d("nvmlDeviceGetNvLinkState", link_state, c_uint, P)

        def link_errors(gpu: FakeGpu, link: int, counter: int, out: int) -> int:
            if gpu.generation == "blackwell":
                return NOT_SUPPORTED  # removed on Blackwell (NVML 570 release notes)
            if link not in gpu.nvlinks:
                return 2
            _put_ull(out, gpu.nvlink_errors.get((link, counter), 0))
            return SUCCESS

        lib.nvmlDeviceGetNvLinkErrorCounter = d(
            "nvmlDeviceGetNvLinkErrorCounter", link_errors, c_uint, c_uint, P
        )

        def field_values(gpu: FakeGpu, n: int, array: int) -> int:
            """Each nvmlFieldValue_t answered on its own, as the driver does: its own nvmlReturn, valueType,
            value and timestamp; the call itself succeeds."""
            size = ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
            stamp = self.now_us if self.now_us is not None else int(time.time() * 1e6)
            asked = [pynvml.c_nvmlFieldValue_t.from_address(array + i * size) for i in range(n)]
            self.field_calls.append((gpu.index, [(int(v.fieldId), int(v.scopeId)) for v in asked]))
            for value in asked:
                answer = self._field(gpu, int(value.fieldId), int(value.scopeId))
                value.timestamp, value.latencyUsec = stamp, 3
                if isinstance(answer, int) and not isinstance(answer, bool) and answer < 0:
                    value.nvmlReturn = -answer  # an error code for this value only
                    continue
                assert isinstance(answer, tuple)  # a non-negative bare int is no answer
                kind, number = answer
                value.nvmlReturn, value.valueType = SUCCESS, kind
                if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
                    value.value.ullVal = number
                else:
                    value.value.uiVal = number
            return SUCCESS

        lib.nvmlDeviceGetFieldValues = d("nvmlDeviceGetFieldValues", field_values, c_int, P)

        for fn_name, pick in (
            ("nvmlDeviceGetCurrPcieLinkGeneration", lambda g: g.pcie_gen[0]),
            ("nvmlDeviceGetMaxPcieLinkGeneration", lambda g: g.pcie_gen[1]),
            ("nvmlDeviceGetCurrPcieLinkWidth", lambda g: g.pcie_width[0]),
            ("nvmlDeviceGetMaxPcieLinkWidth", lambda g: g.pcie_width[1]),
        ):
            setattr(lib, fn_name, d(fn_name, uint(pick), P))

        def violation(gpu: FakeGpu, policy: int, out: int) -> int:
            if policy not in gpu.violations:
                return NOT_SUPPORTED
            v = pynvml.c_nvmlViolationTime_t.from_address(out)
            v.referenceTime = self.now_us if self.now_us is not None else int(time.time() * 1e6)
            v.violationTime = gpu.violations[policy]
            return SUCCESS

        lib.nvmlDeviceGetViolationStatus = d("nvmlDeviceGetViolationStatus", violation, c_uint, P)

        def fabric(gpu: FakeGpu, out: int) -> int:
            if gpu.fabric is None:
                return NOT_SUPPORTED
            info = pynvml.c_nvmlGpuFabricInfo_t.from_address(out)
            info.state, info.status, info.cliqueId = gpu.fabric
            return SUCCESS

        lib.nvmlDeviceGetGpuFabricInfo = d("nvmlDeviceGetGpuFabricInfo", fabric, P)

        def event_set_create(out: int) -> int:
            c_void_p.from_address(out).value = EVENT_SET
            return SUCCESS

        lib.nvmlEventSetCreate = self._cfunc(event_set_create, P)

        def supported_events(gpu: FakeGpu, out: int) -> int:
            _put_ull(out, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError)
            return SUCCESS

        lib.nvmlDeviceGetSupportedEventTypes = d("nvmlDeviceGetSupportedEventTypes", supported_events, P)
        lib.nvmlDeviceRegisterEvents = d(
            "nvmlDeviceRegisterEvents", lambda gpu, types_, es: SUCCESS, c_ulonglong, P
        )

        def event_wait(event_set: int | None, out: int, timeout_ms: int) -> int:
            try:
                gpu, xid = self.events.get(timeout=timeout_ms / 1000)
            except queue.Empty:
                return TIMEOUT
            data = pynvml.c_nvmlEventData_t.from_address(out)
            c_void_p.from_address(out + pynvml.c_nvmlEventData_t.device.offset).value = self.gpus[gpu].handle
            data.eventType = pynvml.nvmlEventTypeXidCriticalError
            data.eventData = xid
            return SUCCESS

        lib.nvmlEventSetWait_v2 = self._cfunc(event_wait, P, P, c_uint)
        lib.nvmlEventSetFree = self._cfunc(lambda es: SUCCESS, P)
        for install in component_fakes():
            install(lib, d)
        return lib


def _component_modules() -> list[types.ModuleType]:
    found = []
    for module in pkgutil.iter_modules([str(COMPONENT_TESTS)]):
        if module.ispkg and (COMPONENT_TESTS / module.name / "fake_nvml.py").exists():
            found.append(importlib.import_module(f"tests.components.{module.name}.fake_nvml"))
    return found


def component_fakes() -> list[Callable[[types.SimpleNamespace, Device], None]]:
    """The ``install(lib, device)`` of every ``tests/components/<name>/fake_nvml.py``: the NVML functions
    a component reads that the fake above does not answer, kept with the component's tests (a new signal's
    read needs no change here)."""
    return [module.install for module in _component_modules()]


def component_unsupported() -> frozenset[str]:
    """The reads (``agent once``'s "unsupported" keys) the components' fakes answer NOT_SUPPORTED unless a
    test of the component's own folder sets them up: other folders' golden files leave them out."""
    return frozenset(key for module in _component_modules() for key in module.UNSUPPORTED_BY_DEFAULT)

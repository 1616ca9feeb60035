"""Recorded GPUs: an NVML library that answers every call from a recorded ``nvidia-smi -q -x`` output.

:class:`ReplayLibrary` is installed as nvidia-ml-py's ``nvmlLib`` (the C library pynvml calls through), so
pynvml's own marshalling, the agent's :class:`~sentinel.agent.nvml.NvmlSource` and every component's NVML
read run unchanged; only the driver behind them is the recording. :data:`MAPPING` says which element
answers which call and field (docs/agent.md "Recorded GPUs" prints it): the first listed element present
answers (driver generations name things differently), an absent element or ``N/A`` answers NOT_SUPPORTED,
an NVML error string (``Unknown Error``, ``GPU requires reset``) answers that error, and text that is not
what the element holds answers NVML_ERROR_UNKNOWN. A recording that uses ``clocks_throttle_reasons`` (a
driver before R535) has no ``nvmlDeviceGetCurrentClocksEventReasons``, as that driver's library has none.
"""

from __future__ import annotations

import calendar
import contextlib
import ctypes
import re
import time
import types
import uuid as uuid_mod
from collections.abc import Callable, Iterator
from ctypes import CFUNCTYPE, c_int, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass
from typing import Any, Final

import pynvml

from sentinel.agent.nvml.recording import Node

SUCCESS: Final = 0
NOT_SUPPORTED: Final = int(pynvml.NVML_ERROR_NOT_SUPPORTED)
INVALID_ARGUMENT: Final = int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
INSUFFICIENT_SIZE: Final = int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
TIMEOUT: Final = int(pynvml.NVML_ERROR_TIMEOUT)
UNKNOWN: Final = int(pynvml.NVML_ERROR_UNKNOWN)
HANDLE_BASE: Final = 0x5E00_0000
EVENT_SET: Final = 0x5E0E_0000
_UINT_MAX: Final = 2**32 - 1
_ULL_MAX: Final = 2**64 - 1

#: what nvidia-smi prints for a field it could not read (``nvmlErrorString``) → the NVML return code
ERROR_TEXTS: Final[dict[str, int]] = {
    "success": SUCCESS,
    "uninitialized": int(pynvml.NVML_ERROR_UNINITIALIZED),
    "invalid argument": INVALID_ARGUMENT,
    "not supported": NOT_SUPPORTED,
    "insufficient permissions": int(pynvml.NVML_ERROR_NO_PERMISSION),
    "not found": int(pynvml.NVML_ERROR_NOT_FOUND),
    "driver not loaded": int(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
    "timeout": TIMEOUT,
    "corrupted inforom": int(pynvml.NVML_ERROR_CORRUPTED_INFOROM),
    "gpu is lost": int(pynvml.NVML_ERROR_GPU_IS_LOST),
    "gpu requires reset": int(pynvml.NVML_ERROR_RESET_REQUIRED),
    "in use by another client": int(pynvml.NVML_ERROR_IN_USE),
    "insufficient memory": int(pynvml.NVML_ERROR_MEMORY),
    "no data": int(pynvml.NVML_ERROR_NO_DATA),
    "unknown error": UNKNOWN,
}
#: what nvidia-smi prints where a field does not exist on this GPU or driver
NOT_APPLICABLE: Final = frozenset({"", "n/a", "[n/a]", "[not supported]"})


@dataclass(frozen=True, slots=True)
class Failure:
    """An NVML return code a read answers instead of a value."""

    code: int


Value = int | str
Answer = Value | Failure
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _first_number(text: str) -> float | None:
    match = _NUMBER.match(text.strip())
    return float(match.group()) if match else None


def _integer(scale: float) -> Callable[[str], Value | None]:
    def read(text: str) -> Value | None:
        number = _first_number(text)
        if number is None or number < 0:
            return None
        return round(number * scale)

    return read


def _pstate(text: str) -> Value | None:
    lowered = text.strip().lower()
    if lowered == "unknown":
        return int(pynvml.NVML_PSTATE_UNKNOWN)
    if lowered.startswith("p") and lowered[1:].isdigit() and int(lowered[1:]) <= 15:
        return int(lowered[1:])
    return None


def _yes_no(text: str) -> Value | None:
    return {"yes": 1, "no": 0, "true": 1, "false": 0}.get(text.strip().lower())


def _active(text: str) -> Value | None:
    return {"active": 1, "not active": 0}.get(text.strip().lower())


def _text(text: str) -> Value | None:
    return text


#: nvidia-smi's fabric state → nvmlGpuFabricState_t
FABRIC_STATES: Final[dict[str, int]] = {
    "not supported": int(pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED),
    "not started": int(pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED),
    "in progress": int(pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS),
    "completed": int(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED),
}


def _fabric_state(text: str) -> Value | None:
    return FABRIC_STATES.get(text.strip().lower())


def _nvml_return(text: str) -> Value | None:
    """A field whose value is itself an NVML return code (the fabric's status): its error string."""
    return ERROR_TEXTS.get(text.strip().lower(), UNKNOWN)


def _cluster_uuid(text: str) -> Value | None:
    try:
        return str(uuid_mod.UUID(text.strip()))
    except ValueError:
        return None


#: the driver's recovery action as nvidia-smi prints it → nvmlDeviceGpuRecoveryAction_t
RECOVERY_ACTIONS: Final[dict[str, int]] = {
    "none": 0,
    "reset": 1,
    "gpu reset": 1,
    "reboot": 2,
    "node reboot": 2,
    "drain p2p": 3,
    "drain and reset": 4,
}


def _recovery(text: str) -> Value | None:
    return RECOVERY_ACTIONS.get(" ".join(text.strip().lower().replace("_", " ").split()))


def _health_bit(true: str, false: str) -> Callable[[str], Value | None]:
    def read(text: str) -> Value | None:
        lowered = text.strip().lower()
        return 1 if lowered == true else (2 if lowered == false else None)

    return read


#: how an element's text is read: name (as the table prints it) → parser (None: not what it holds)
READINGS: Final[dict[str, Callable[[str], Value | None]]] = {
    "text": _text,
    "integer": _integer(1),
    "MHz": _integer(1),
    "°C": _integer(1),
    "%": _integer(1),
    "KB/s": _integer(1),
    "lanes (16x)": _integer(1),
    "W → mW": _integer(1000),
    "MiB → bytes": _integer(2**20),
    "µs → ns": _integer(1000),
    "P0..P15": _pstate,
    "Yes/No": _yes_no,
    "Active/Not Active": _active,
    "fabric state": _fabric_state,
    "NVML error string": _nvml_return,
    "UUID": _cluster_uuid,
    "recovery action": _recovery,
    "Full/Degraded": _health_bit("degraded", "full"),
    "True/False": _health_bit("true", "false"),
}


@dataclass(frozen=True, slots=True)
class Source:
    """One row of the mapping: the elements that answer one NVML function's field.

    ``paths`` are below ``<gpu>`` (the root for system calls), the first one present answers; ``a+b`` is the
    sum of both elements (each must be present). ``optional``: when absent the call still answers, with 0.
    """

    function: str
    field: str
    paths: tuple[str, ...]
    reading: str
    optional: bool = False


def _s(function: str, field: str, reading: str, *paths: str, optional: bool = False) -> Source:
    return Source(function, field, paths, reading, optional)


_ECC = "nvmlDeviceGetTotalEccErrors"
_LOC = "nvmlDeviceGetMemoryErrorCounter"
_EVENT = "nvmlDeviceGetCurrentClocksEventReasons"
#: nvmlClocksEventReason* bit → nvidia-smi's tag (``clocks_event_reason_<tag>``; before R535
#: ``clocks_throttle_reasons/clocks_throttle_reason_<tag>``)
REASON_BITS: Final[dict[int, str]] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}


def _ecc_rows() -> list[Source]:
    rows: list[Source] = []
    for error, err_name in (("correctable", "CORRECTED"), ("uncorrectable", "UNCORRECTED")):
        bits = "single_bit" if error == "correctable" else "double_bit"
        for counter in ("volatile", "aggregate"):
            e = f"ecc_errors/{counter}"
            sram = (
                (f"{e}/sram_uncorrectable_parity+{e}/sram_uncorrectable_secded", f"{e}/sram_uncorrectable")
                if error == "uncorrectable"
                else (f"{e}/sram_correctable",)
            )
            rows.append(
                _s(
                    _ECC,
                    f"{err_name}, {counter.upper()}",
                    "integer",
                    *(f"{s}+{e}/dram_{error}" for s in sram),
                    f"{e}/{bits}/total",
                )
            )
            rows.append(_s(_LOC, f"{err_name}, {counter.upper()}, SRAM", "integer", *sram))
            rows.append(
                _s(
                    _LOC,
                    f"{err_name}, {counter.upper()}, DRAM",
                    "integer",
                    f"{e}/dram_{error}",
                    f"{e}/{bits}/device_memory",
                )
            )
            for location, tag in (
                ("L1_CACHE", "l1_cache"),
                ("L2_CACHE", "l2_cache"),
                ("REGISTER_FILE", "register_file"),
                ("TEXTURE_MEMORY", "texture_memory"),
                ("TEXTURE_SHM", "texture_shm"),
                ("CBU", "cbu"),
            ):
                rows.append(
                    _s(_LOC, f"{err_name}, {counter.upper()}, {location}", "integer", f"{e}/{bits}/{tag}")
                )
    return rows


_POWER = "gpu_power_readings"
_LINK = "pci/pci_gpu_link_info"
_REMAP = "remapped_rows"
_HIST = "remapped_rows/remapped_row_histogram/row_remap_histogram"
_RETIRED = "retired_pages"
_COUNTERS = "clocks_event_reasons_counters/clocks_event_reasons_counters"
#: every NVML answer the recording gives, in the order docs/agent.md lists them
MAPPING: Final[tuple[Source, ...]] = (
    _s("nvmlSystemGetDriverVersion", "", "text", "driver_version"),
    _s("nvmlDeviceGetCount_v2", "", "integer", "gpu (one per element)"),
    _s("nvmlDeviceGetUUID", "", "text", "uuid"),
    _s("nvmlDeviceGetName", "", "text", "product_name"),
    _s("nvmlDeviceGetSerial", "", "text", "serial"),
    _s("nvmlDeviceGetVbiosVersion", "", "text", "vbios_version"),
    _s("nvmlDeviceGetPciInfo_v3", "busId", "text", "pci/pci_bus_id", "@id"),
    _s("nvmlDeviceGetMemoryInfo", "total", "MiB → bytes", "fb_memory_usage/total"),
    _s("nvmlDeviceGetMemoryInfo", "used", "MiB → bytes", "fb_memory_usage/used"),
    _s("nvmlDeviceGetMemoryInfo", "free", "MiB → bytes", "fb_memory_usage/free", optional=True),
    _s("nvmlDeviceGetUtilizationRates", "gpu", "%", "utilization/gpu_util"),
    _s("nvmlDeviceGetUtilizationRates", "memory", "%", "utilization/memory_util"),
    _s("nvmlDeviceGetComputeRunningProcesses_v3", "pid", "integer", "processes/process_info/pid (type C or C+G)"),
    _s("nvmlDeviceGetComputeRunningProcesses_v3", "usedGpuMemory", "MiB → bytes", "processes/process_info/used_memory", optional=True),
    _s("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU", "°C", "temperature/gpu_temp"),
    _s("nvmlDeviceGetPowerUsage", "", "W → mW", f"{_POWER}/power_draw", f"{_POWER}/average_power_draw", f"{_POWER}/instant_power_draw", "power_readings/power_draw"),
    _s("nvmlDeviceGetEnforcedPowerLimit", "", "W → mW", f"{_POWER}/current_power_limit", "power_readings/enforced_power_limit"),
    _s("nvmlDeviceGetClockInfo", "NVML_CLOCK_GRAPHICS", "MHz", "clocks/graphics_clock"),
    _s("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM", "MHz", "clocks/sm_clock"),
    _s("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM", "MHz", "clocks/mem_clock"),
    _s("nvmlDeviceGetClockInfo", "NVML_CLOCK_VIDEO", "MHz", "clocks/video_clock"),
    _s("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_GRAPHICS", "MHz", "max_clocks/graphics_clock"),
    _s("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM", "MHz", "max_clocks/sm_clock"),
    _s("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM", "MHz", "max_clocks/mem_clock"),
    _s("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_VIDEO", "MHz", "max_clocks/video_clock"),
    _s("nvmlDeviceGetPerformanceState", "", "P0..P15", "performance_state"),
    *(
        _s(
            f"{_EVENT} (and ...ThrottleReasons)",
            f"bit {bit:#x}",
            "Active/Not Active",
            f"clocks_event_reasons/clocks_event_reason_{tag}",
            f"clocks_throttle_reasons/clocks_throttle_reason_{tag}",
        )
        for bit, tag in REASON_BITS.items()
    ),
    _s("nvmlDeviceGetViolationStatus", "NVML_PERF_POLICY_POWER", "µs → ns", f"{_COUNTERS}_sw_power_cap"),
    _s("nvmlDeviceGetViolationStatus", "NVML_PERF_POLICY_SYNC_BOOST", "µs → ns", f"{_COUNTERS}_sync_boost"),
    _s("nvmlDeviceGetPcieReplayCounter", "", "integer", "pci/replay_counter"),
    _s("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_TX_BYTES", "KB/s", "pci/tx_util"),
    _s("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_RX_BYTES", "KB/s", "pci/rx_util"),
    _s("nvmlDeviceGetCurrPcieLinkGeneration", "", "integer", f"{_LINK}/pcie_gen/current_link_gen"),
    _s("nvmlDeviceGetMaxPcieLinkGeneration", "", "integer", f"{_LINK}/pcie_gen/max_link_gen"),
    _s("nvmlDeviceGetCurrPcieLinkWidth", "", "lanes (16x)", f"{_LINK}/link_widths/current_link_width"),
    _s("nvmlDeviceGetMaxPcieLinkWidth", "", "lanes (16x)", f"{_LINK}/link_widths/max_link_width"),
    *_ecc_rows(),
    _s("nvmlDeviceGetRemappedRows", "corrRows", "integer", f"{_REMAP}/remapped_row_corr"),
    _s("nvmlDeviceGetRemappedRows", "uncRows", "integer", f"{_REMAP}/remapped_row_unc"),
    _s("nvmlDeviceGetRemappedRows", "isPending", "Yes/No", f"{_REMAP}/remapped_row_pending"),
    _s("nvmlDeviceGetRemappedRows", "failureOccurred", "Yes/No", f"{_REMAP}/remapped_row_failure"),
    *(
        _s("nvmlDeviceGetRowRemapperHistogram", name, "integer", f"{_HIST}_{name}")
        for name in ("max", "high", "partial", "low", "none")
    ),
    _s("nvmlDeviceGetRetiredPages", "MULTIPLE_SINGLE_BIT_ECC_ERRORS", "integer", f"{_RETIRED}/multiple_single_bit_retirement/retired_count"),
    _s("nvmlDeviceGetRetiredPages", "DOUBLE_BIT_ECC_ERROR", "integer", f"{_RETIRED}/double_bit_retirement/retired_count"),
    _s("nvmlDeviceGetRetiredPagesPendingStatus", "", "Yes/No", f"{_RETIRED}/pending_blacklist", f"{_RETIRED}/pending_retirement"),
    _s("nvmlDeviceGetGpuFabricInfo / ...InfoV", "state", "fabric state", "fabric/state"),
    _s("nvmlDeviceGetGpuFabricInfo / ...InfoV", "status", "NVML error string", "fabric/status", optional=True),
    _s("nvmlDeviceGetGpuFabricInfo / ...InfoV", "cliqueId", "integer", "fabric/cliqueId", "fabric/clique_id", optional=True),
    _s("nvmlDeviceGetGpuFabricInfo / ...InfoV", "clusterUuid", "UUID", "fabric/clusterUuid", "fabric/cluster_uuid", optional=True),
    _s("nvmlDeviceGetGpuFabricInfoV", "healthMask DEGRADED_BW", "Full/Degraded", "fabric/health/bandwidth", optional=True),
    _s("nvmlDeviceGetGpuFabricInfoV", "healthMask ROUTE_RECOVERY", "True/False", "fabric/health/route_recovery_in_progress", optional=True),
    _s("nvmlDeviceGetGpuFabricInfoV", "healthMask ROUTE_UNHEALTHY", "True/False", "fabric/health/route_unhealthy", optional=True),
    _s("nvmlDeviceGetGpuFabricInfoV", "healthMask ACCESS_TIMEOUT_RECOVERY", "True/False", "fabric/health/access_timeout_recovery", optional=True),
    _s("nvmlDeviceGetFieldValues", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "recovery action", "gpu_recovery_action"),
    _s("nvmlDeviceGetFieldValues", "NVML_FI_DEV_MEMORY_TEMP", "°C", "temperature/memory_temp"),
)  # fmt: skip
#: NVML calls a recording cannot answer (nvidia-smi -q -x does not print them): NOT_SUPPORTED
NOT_RECORDED: Final[tuple[str, ...]] = (
    "nvmlDeviceGetNvLinkState (so no NVLink links or counters)",
    "nvmlDeviceGetFieldValues for any other field id",
    "nvmlDeviceGetSupportedEventTypes (so no Xid events)",
    "nvmlDeviceGetViolationStatus for the other policies",
)
_BY_KEY: Final[dict[tuple[str, str], Source]] = {(s.function, s.field): s for s in MAPPING}
_HEALTH_SHIFTS: Final[dict[str, int]] = {
    "healthMask DEGRADED_BW": int(pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW),
    "healthMask ROUTE_RECOVERY": int(pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY),
    "healthMask ROUTE_UNHEALTHY": int(pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY),
    "healthMask ACCESS_TIMEOUT_RECOVERY": int(
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY
    ),
}


def mapping_markdown() -> str:
    """The mapping as the Markdown table docs/agent.md carries (a test keeps the two equal)."""
    lines = ["| NVML call | field / argument | XML element (first present) | read as |", "|---|---|---|---|"]
    for s in MAPPING:
        paths = " or ".join(f"`{p}`" for p in s.paths)
        reading = s.reading + (" (absent: 0)" if s.optional else "")
        lines.append(f"| `{s.function}` | {s.field or '-'} | {paths} | {reading} |")
    return "\n".join(lines) + "\n"


def _element(gpu: Node, path: str) -> str | Failure | None:
    """The text at one path (``@id``: the gpu's attribute); None when absent or N/A. A section nvidia-smi
    printed as one value (``<remapped_rows>N/A</remapped_rows>``, or an error string) answers for all below."""
    if path == "@id":
        return gpu.attrs.get("id") or None
    node: Node | None = gpu
    for part in path.split("/"):
        assert node is not None
        if not node.children and node is not gpu:
            break  # a leaf above the path's end: the whole section's answer
        node = node.find(part)
        if node is None:
            return None
    assert node is not None
    if node.children:
        return None
    text = node.text
    if text.lower() in NOT_APPLICABLE or text.lower() == "not supported":
        return None
    code = ERROR_TEXTS.get(text.strip("[]").lower())
    if code is not None and code != SUCCESS:
        return Failure(code)
    return text


def read(gpu: Node, function: str, field: str) -> Answer:
    """The recording's answer for one row of :data:`MAPPING`: a value or the NVML error it answers."""
    source = _BY_KEY[(function, field)]
    parser = READINGS[source.reading]
    for path in source.paths:
        parts = path.split("+")
        texts = [_element(gpu, p) if source.reading != "NVML error string" else _raw(gpu, p) for p in parts]
        if any(t is None for t in texts):
            continue
        failure = next((t for t in texts if isinstance(t, Failure)), None)
        if failure is not None:
            return failure
        values = [v for v in (parser(str(t)) for t in texts) if v is not None]
        if len(values) < len(texts):
            return Failure(UNKNOWN)
        return values[0] if len(values) == 1 else sum(int(v) for v in values)
    return 0 if source.optional else Failure(NOT_SUPPORTED)


def _raw(gpu: Node, path: str) -> str | None:
    node = gpu.find(path)
    if node is None or node.children or node.text.lower() in NOT_APPLICABLE:
        return None
    return node.text


def _put_uint(address: int, value: int) -> None:
    c_uint.from_address(address).value = value


def _put_ull(address: int, value: int) -> None:
    c_ulonglong.from_address(address).value = value


def _number(answer: Answer, limit: int) -> int | Failure:
    """An integer answer that fits its C type, else the error the call answers."""
    if isinstance(answer, Failure):
        return answer
    if isinstance(answer, str) or not 0 <= answer <= limit:
        return Failure(UNKNOWN)
    return answer


def _struct(answers: list[Answer], limit: int) -> list[int] | Failure:
    """All fields of one struct call, or the first field's error (the call fails as a whole)."""
    out: list[int] = []
    for answer in answers:
        number = _number(answer, limit)
        if isinstance(number, Failure):
            return number
        out.append(number)
    return out


def _timestamp_us(root: Node) -> int:
    """The recording's own time (``<timestamp>``, e.g. ``Tue Dec  1 10:00:00 2026``) in µs; 0 if unreadable."""
    node = root.find("timestamp")
    if node is None:
        return 0
    try:
        # nvidia-smi prints the host's local time without a zone: read as UTC, the same on every machine
        return calendar.timegm(time.strptime(" ".join(node.text.split()), "%a %b %d %H:%M:%S %Y")) * 1_000_000
    except (ValueError, OverflowError):
        return 0


_CLOCKS: Final[dict[int, str]] = {
    int(pynvml.NVML_CLOCK_GRAPHICS): "NVML_CLOCK_GRAPHICS",
    int(pynvml.NVML_CLOCK_SM): "NVML_CLOCK_SM",
    int(pynvml.NVML_CLOCK_MEM): "NVML_CLOCK_MEM",
    int(pynvml.NVML_CLOCK_VIDEO): "NVML_CLOCK_VIDEO",
}
_LOCATIONS: Final[dict[int, str]] = {
    0: "L1_CACHE",
    1: "L2_CACHE",
    2: "DRAM",
    3: "REGISTER_FILE",
    4: "TEXTURE_MEMORY",
    5: "TEXTURE_SHM",
    6: "CBU",
    7: "SRAM",
}
_FIELDS: Final[dict[int, str]] = {
    int(getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)): "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    int(pynvml.NVML_FI_DEV_MEMORY_TEMP): "NVML_FI_DEV_MEMORY_TEMP",
}
_POLICIES: Final[dict[int, str]] = {
    int(pynvml.NVML_PERF_POLICY_POWER): "NVML_PERF_POLICY_POWER",
    int(pynvml.NVML_PERF_POLICY_SYNC_BOOST): "NVML_PERF_POLICY_SYNC_BOOST",
}
P = c_void_p


class ReplayLibrary:
    """The recording as libnvidia-ml: a namespace of C-callable functions (``.lib``) for pynvml."""

    def __init__(self, root: Node) -> None:
        self.root = root
        self.gpus = root.findall("gpu")
        self.driver = read(root, "nvmlSystemGetDriverVersion", "")
        self.reference_us = _timestamp_us(root)
        #: the recording's driver printed ``clocks_throttle_reasons``: its library has no event-reasons call
        self.throttle_only = any(
            g.find("clocks_throttle_reasons") is not None and g.find("clocks_event_reasons") is None
            for g in self.gpus
        )
        self._keep: list[Any] = []
        self.lib = self._build()

    @contextlib.contextmanager
    def installed(self) -> Iterator[ReplayLibrary]:
        """pynvml calls this library while the block runs (its loaded library and lookups restored after)."""
        saved = (pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache)
        pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache = self.lib, {}
        try:
            yield self
        finally:
            pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache = saved

    # -- plumbing -------------------------------------------------------------------------------------------

    def _cfunc(self, fn: Callable[..., int], *argtypes: Any) -> Any:
        cb = CFUNCTYPE(c_int, *argtypes)(fn)
        self._keep.append(cb)
        return cb

    def _device(self, body: Callable[..., int], *argtypes: Any) -> Any:
        def call(handle: int | None, *args: Any) -> int:
            index = (handle or 0) - HANDLE_BASE
            if not 0 <= index < len(self.gpus):
                return INVALID_ARGUMENT
            return body(self.gpus[index], *args)

        return self._cfunc(call, P, *argtypes)

    def _scalar(self, function: str, field: str, limit: int, put: Callable[[int, int], None]) -> Any:
        def body(gpu: Node, out: int) -> int:
            number = _number(read(gpu, function, field), limit)
            if isinstance(number, Failure):
                return number.code
            put(out, number)
            return SUCCESS

        return self._device(body, P)

    def _string(self, function: str) -> Any:
        def body(gpu: Node, buf: int, size: int) -> int:
            return _put_text(read(gpu, function, ""), buf, size)

        return self._device(body, P, c_uint)

    # -- the library ----------------------------------------------------------------------------------------

    def _build(self) -> types.SimpleNamespace:
        lib = types.SimpleNamespace()
        d = self._device
        lib.nvmlInitWithFlags = self._cfunc(lambda flags: SUCCESS, c_uint)
        lib.nvmlShutdown = self._cfunc(lambda: SUCCESS)
        lib.nvmlSystemGetDriverVersion = self._cfunc(
            lambda buf, size: _put_text(self.driver, buf, size), P, c_uint
        )

        def count(out: int) -> int:
            _put_uint(out, len(self.gpus))
            return SUCCESS

        lib.nvmlDeviceGetCount_v2 = self._cfunc(count, P)

        def handle(index: int, out: int) -> int:
            if index >= len(self.gpus):
                return INVALID_ARGUMENT
            c_void_p.from_address(out).value = HANDLE_BASE + index
            return SUCCESS

        lib.nvmlDeviceGetHandleByIndex_v2 = self._cfunc(handle, c_uint, P)
        for name in (
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetSerial",
            "nvmlDeviceGetVbiosVersion",
        ):
            setattr(lib, name, self._string(name))

        def pci(gpu: Node, out: int) -> int:
            bus = read(gpu, "nvmlDeviceGetPciInfo_v3", "busId")
            if isinstance(bus, Failure):
                return bus.code
            encoded = str(bus).encode("ascii", "replace")
            if len(encoded) >= 32:
                return UNKNOWN
            info = pynvml.nvmlPciInfo_t.from_address(out)
            info.busId = encoded
            info.busIdLegacy = encoded[-15:]
            parts = str(bus).split(".")[0].split(":")
            with contextlib.suppress(ValueError, IndexError, OverflowError):
                info.domain, info.bus, info.device = (int(parts[0], 16), int(parts[1], 16), int(parts[2], 16))
            return SUCCESS

        lib.nvmlDeviceGetPciInfo_v3 = d(pci, P)

        def memory(gpu: Node, out: int) -> int:
            f = "nvmlDeviceGetMemoryInfo"
            values = _struct([read(gpu, f, "total"), read(gpu, f, "used"), read(gpu, f, "free")], _ULL_MAX)
            if isinstance(values, Failure):
                return values.code
            total, used, free = values
            m = pynvml.c_nvmlMemory_t.from_address(out)
            m.total, m.used, m.free = total, used, free or max(total - used, 0)
            return SUCCESS

        lib.nvmlDeviceGetMemoryInfo = d(memory, P)

        def util(gpu: Node, out: int) -> int:
            f = "nvmlDeviceGetUtilizationRates"
            values = _struct([read(gpu, f, "gpu"), read(gpu, f, "memory")], _UINT_MAX)
            if isinstance(values, Failure):
                return values.code
            u = pynvml.c_nvmlUtilization_t.from_address(out)
            u.gpu, u.memory = values
            return SUCCESS

        lib.nvmlDeviceGetUtilizationRates = d(util, P)
        lib.nvmlDeviceGetComputeRunningProcesses_v3 = d(self._processes, P, P)

        def temperature(gpu: Node, sensor: int, out: int) -> int:
            if sensor != int(pynvml.NVML_TEMPERATURE_GPU):
                return INVALID_ARGUMENT
            return _answer_uint(read(gpu, "nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"), out)

        lib.nvmlDeviceGetTemperature = d(temperature, c_uint, P)
        lib.nvmlDeviceGetPowerUsage = self._scalar("nvmlDeviceGetPowerUsage", "", _UINT_MAX, _put_uint)
        lib.nvmlDeviceGetEnforcedPowerLimit = self._scalar(
            "nvmlDeviceGetEnforcedPowerLimit", "", _UINT_MAX, _put_uint
        )

        def clock(function: str) -> Any:
            def body(gpu: Node, kind: int, out: int) -> int:
                if kind not in _CLOCKS:
                    return INVALID_ARGUMENT
                return _answer_uint(read(gpu, function, _CLOCKS[kind]), out)

            return d(body, c_uint, P)

        lib.nvmlDeviceGetClockInfo = clock("nvmlDeviceGetClockInfo")
        lib.nvmlDeviceGetMaxClockInfo = clock("nvmlDeviceGetMaxClockInfo")
        lib.nvmlDeviceGetPerformanceState = self._scalar(
            "nvmlDeviceGetPerformanceState", "", _UINT_MAX, _put_uint
        )

        def reasons(gpu: Node, out: int) -> int:
            mask, seen = 0, False
            for bit in REASON_BITS:
                answer = read(gpu, f"{_EVENT} (and ...ThrottleReasons)", f"bit {bit:#x}")
                if isinstance(answer, Failure):
                    if answer.code != NOT_SUPPORTED:
                        return answer.code
                    continue
                seen = True
                mask |= bit if answer else 0
            if not seen:
                return NOT_SUPPORTED
            _put_ull(out, mask)
            return SUCCESS

        if not self.throttle_only:
            lib.nvmlDeviceGetCurrentClocksEventReasons = d(reasons, P)
        lib.nvmlDeviceGetCurrentClocksThrottleReasons = d(reasons, P)

        def violation(gpu: Node, policy: int, out: int) -> int:
            if policy not in _POLICIES:
                return NOT_SUPPORTED
            number = _number(read(gpu, "nvmlDeviceGetViolationStatus", _POLICIES[policy]), _ULL_MAX)
            if isinstance(number, Failure):
                return number.code
            v = pynvml.c_nvmlViolationTime_t.from_address(out)
            v.referenceTime, v.violationTime = self.reference_us, number
            return SUCCESS

        lib.nvmlDeviceGetViolationStatus = d(violation, c_uint, P)
        lib.nvmlDeviceGetPcieReplayCounter = self._scalar(
            "nvmlDeviceGetPcieReplayCounter", "", _UINT_MAX, _put_uint
        )

        def throughput(gpu: Node, counter: int, out: int) -> int:
            names = {0: "NVML_PCIE_UTIL_TX_BYTES", 1: "NVML_PCIE_UTIL_RX_BYTES"}
            if counter not in names:
                return INVALID_ARGUMENT
            return _answer_uint(read(gpu, "nvmlDeviceGetPcieThroughput", names[counter]), out)

        lib.nvmlDeviceGetPcieThroughput = d(throughput, c_uint, P)
        for name in (
            "nvmlDeviceGetCurrPcieLinkGeneration",
            "nvmlDeviceGetMaxPcieLinkGeneration",
            "nvmlDeviceGetCurrPcieLinkWidth",
            "nvmlDeviceGetMaxPcieLinkWidth",
        ):
            setattr(lib, name, self._scalar(name, "", _UINT_MAX, _put_uint))

        def total_ecc(gpu: Node, error: int, counter: int, out: int) -> int:
            if error not in (0, 1) or counter not in (0, 1):
                return INVALID_ARGUMENT
            field = f"{('CORRECTED', 'UNCORRECTED')[error]}, {('VOLATILE', 'AGGREGATE')[counter]}"
            return _answer_ull(read(gpu, _ECC, field), out)

        lib.nvmlDeviceGetTotalEccErrors = d(total_ecc, c_uint, c_uint, P)

        def ecc_location(gpu: Node, error: int, counter: int, location: int, out: int) -> int:
            if error not in (0, 1) or counter not in (0, 1) or location not in _LOCATIONS:
                return INVALID_ARGUMENT
            kinds = f"{('CORRECTED', 'UNCORRECTED')[error]}, {('VOLATILE', 'AGGREGATE')[counter]}"
            return _answer_ull(read(gpu, _LOC, f"{kinds}, {_LOCATIONS[location]}"), out)

        lib.nvmlDeviceGetMemoryErrorCounter = d(ecc_location, c_uint, c_uint, c_uint, P)

        def remapped(gpu: Node, corr: int, unc: int, pending: int, failure: int) -> int:
            f = "nvmlDeviceGetRemappedRows"
            fields = ("corrRows", "uncRows", "isPending", "failureOccurred")
            values = _struct([read(gpu, f, name) for name in fields], _UINT_MAX)
            if isinstance(values, Failure):
                return values.code
            for address, value in zip((corr, unc, pending, failure), values, strict=True):
                _put_uint(address, value)
            return SUCCESS

        lib.nvmlDeviceGetRemappedRows = d(remapped, P, P, P, P)

        def histogram(gpu: Node, out: int) -> int:
            names = ("max", "high", "partial", "low", "none")
            values = _struct([read(gpu, "nvmlDeviceGetRowRemapperHistogram", n) for n in names], _UINT_MAX)
            if isinstance(values, Failure):
                return values.code
            h = pynvml.c_nvmlRowRemapperHistogramValues.from_address(out)
            h.max, h.high, h.partial, h.low, h.none = values
            return SUCCESS

        lib.nvmlDeviceGetRowRemapperHistogram = d(histogram, P)
        lib.nvmlDeviceGetRetiredPages = d(self._retired, c_uint, P, P)
        lib.nvmlDeviceGetRetiredPagesPendingStatus = self._scalar(
            "nvmlDeviceGetRetiredPagesPendingStatus", "", 1, _put_uint
        )
        lib.nvmlDeviceGetGpuFabricInfo = d(lambda gpu, out: self._fabric(gpu, out, versioned=False), P)
        lib.nvmlDeviceGetGpuFabricInfoV = d(lambda gpu, out: self._fabric(gpu, out, versioned=True), P)
        lib.nvmlDeviceGetFieldValues = d(self._field_values, c_int, P)
        lib.nvmlDeviceGetNvLinkState = d(lambda gpu, link, out: NOT_SUPPORTED, c_uint, P)

        def event_set_create(out: int) -> int:
            c_void_p.from_address(out).value = EVENT_SET
            return SUCCESS

        lib.nvmlEventSetCreate = self._cfunc(event_set_create, P)
        lib.nvmlDeviceGetSupportedEventTypes = d(lambda gpu, out: NOT_SUPPORTED, P)
        lib.nvmlDeviceRegisterEvents = d(lambda gpu, kinds, event_set: NOT_SUPPORTED, c_ulonglong, P)
        lib.nvmlEventSetWait_v2 = self._cfunc(lambda event_set, out, timeout_ms: TIMEOUT, P, P, c_uint)
        lib.nvmlEventSetFree = self._cfunc(lambda event_set: SUCCESS, P)
        return lib

    def _processes(self, gpu: Node, count_out: int, array: int | None) -> int:
        found: list[tuple[int, int]] = []
        table = gpu.find("processes")
        failed = ERROR_TEXTS.get((table.text or "").strip().lower()) if table is not None else None
        if failed:
            return failed  # the list itself could not be read ("Unknown Error" in place of its entries)
        for proc in table.findall("process_info") if table is not None else []:
            kind, pid_node, used = proc.find("type"), proc.find("pid"), proc.find("used_memory")
            if kind is None or "C" not in kind.text.upper() or pid_node is None:
                continue  # graphics-only processes are not compute processes
            pid = _number(_parsed("integer", pid_node.text), _UINT_MAX)
            memory = _number(_parsed("MiB → bytes", used.text), _ULL_MAX) if used is not None else 0
            if isinstance(pid, Failure) or pid == 0:
                continue
            found.append((pid, memory if isinstance(memory, int) else 0))
        have = c_uint.from_address(count_out).value
        if array is None or have < len(found):
            _put_uint(count_out, len(found))
            return INSUFFICIENT_SIZE if found else SUCCESS
        size = ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t)
        for i, (pid, memory) in enumerate(found):
            info = pynvml.c_nvmlProcessInfo_v3_t.from_address(array + i * size)
            info.pid, info.usedGpuMemory = pid, memory
            info.gpuInstanceId = info.computeInstanceId = 0xFFFFFFFF
        _put_uint(count_out, len(found))
        return SUCCESS

    def _retired(self, gpu: Node, cause: int, count_out: int, pages: int | None) -> int:
        names = {0: "MULTIPLE_SINGLE_BIT_ECC_ERRORS", 1: "DOUBLE_BIT_ECC_ERROR"}
        if cause not in names:
            return INVALID_ARGUMENT
        number = _number(read(gpu, "nvmlDeviceGetRetiredPages", names[cause]), 4096)
        if isinstance(number, Failure):
            return number.code
        if pages is None or c_uint.from_address(count_out).value < number:
            _put_uint(count_out, number)
            return INSUFFICIENT_SIZE if number else SUCCESS
        for i in range(number):  # the recording lists no addresses NVML would: each page by its position
            _put_ull(pages + 8 * i, i)
        _put_uint(count_out, number)
        return SUCCESS

    def _fabric(self, gpu: Node, out: int, *, versioned: bool) -> int:
        f = "nvmlDeviceGetGpuFabricInfo / ...InfoV"
        state = _number(read(gpu, f, "state"), _UINT_MAX)
        if isinstance(state, Failure):
            return state.code
        status = _number(read(gpu, f, "status"), _UINT_MAX)
        clique = _number(read(gpu, f, "cliqueId"), _UINT_MAX)
        cluster = read(gpu, f, "clusterUuid")
        if versioned:
            version = c_uint.from_address(out).value
            if version not in (pynvml.nvmlGpuFabricInfo_v2, getattr(pynvml, "nvmlGpuFabricInfo_v3", -1)):
                return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            info: Any = pynvml.c_nvmlGpuFabricInfo_v2_t.from_address(out)
            mask = 0
            for field, shift in _HEALTH_SHIFTS.items():
                bit = read(gpu, "nvmlDeviceGetGpuFabricInfoV", field)
                if isinstance(bit, int):
                    mask |= (bit & 0x3) << shift
            info.healthMask = mask
        else:
            info = pynvml.c_nvmlGpuFabricInfo_t.from_address(out)
        info.state = state
        info.status = status if isinstance(status, int) else UNKNOWN
        info.cliqueId = clique if isinstance(clique, int) else 0
        raw = uuid_mod.UUID(cluster).bytes if isinstance(cluster, str) and cluster else bytes(16)
        ctypes.memmove(ctypes.addressof(info.clusterUuid), raw, 16)
        return SUCCESS

    def _field_values(self, gpu: Node, n: int, array: int) -> int:
        """Each requested value answered on its own (its own nvmlReturn), as the driver does."""
        size = ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
        for i in range(max(0, n)):
            value = pynvml.c_nvmlFieldValue_t.from_address(array + i * size)
            value.timestamp, value.latencyUsec = self.reference_us, 0
            name = _FIELDS.get(int(value.fieldId))
            number = (
                _number(read(gpu, "nvmlDeviceGetFieldValues", name), _UINT_MAX)
                if name is not None
                else Failure(NOT_SUPPORTED)
            )
            if isinstance(number, Failure):
                value.nvmlReturn = number.code
                continue
            value.nvmlReturn, value.valueType = SUCCESS, int(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
            value.value.uiVal = number
        return SUCCESS


def _parsed(reading: str, text: str) -> Answer:
    value = READINGS[reading](text)
    return Failure(UNKNOWN) if value is None else value


def _answer_uint(answer: Answer, out: int) -> int:
    number = _number(answer, _UINT_MAX)
    if isinstance(number, Failure):
        return number.code
    _put_uint(out, number)
    return SUCCESS


def _answer_ull(answer: Answer, out: int) -> int:
    number = _number(answer, _ULL_MAX)
    if isinstance(number, Failure):
        return number.code
    _put_ull(out, number)
    return SUCCESS


def _put_text(answer: Answer, buf: int, size: int) -> int:
    if isinstance(answer, Failure):
        return answer.code
    data = str(answer).encode("utf-8", "replace")
    if len(data) + 1 > size:
        return INSUFFICIENT_SIZE
    ctypes.memmove(buf, data + b"\0", len(data) + 1)
    return SUCCESS

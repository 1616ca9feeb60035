"""The real GPU source: NVML through nvidia-ml-py (``pynvml``).

Every read goes through :meth:`NvmlSource._get`, which turns NVML's error model into the agent's:

- ``NOT_SUPPORTED`` (and a function missing from an older driver) is remembered per (GPU, field) and that
  field is not asked again: some GPUs answer NOT_SUPPORTED slowly, and asking 20 of them every second is
  wasted driver time;
- ``GPU_IS_LOST`` or ``INVALID_ARGUMENT`` on a GPU's read first asks NVML for that index's handle again: a GPU
  unbound and rebound (or reset) while the agent runs leaves its old handle stale, and the read is redone on
  the new handle when the same GPU (by UUID) answers; another GPU at the index re-opens NVML; a GPU that
  answers nothing is lost (:class:`GpuLostError`, the agent marks it so);
- a function missing from an older library (``FUNCTION_NOT_FOUND``) or from an older nvidia-ml-py
  (``AttributeError`` on ``pynvml``) is NOT_SUPPORTED: that read is left out, never the GPU's sample;
- ``RESET_REQUIRED`` on a GPU's read is that GPU's state, not NVML's: the field is left empty (counted) and
  the sample carries the recovery action ``gpu_reset``, which the driver asks for there;
- anything else is reported to ``on_error(function, error)`` (a metric) and the field is left empty; a read
  of a GPU in which every call failed so (at least :data:`UNREACHABLE_AFTER` of them) and none answered is
  :class:`GpuUnreachable`: a driver that answers NVML_ERROR_UNKNOWN to everything serves nothing on that GPU.

All methods block; the agent runs them in per-GPU worker threads with deadlines.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pynvml

from sentinel.agent.source import XidEvent, XidRecord
from sentinel.components.device import nvml as device_nvml
from sentinel.components.nvlink import nvml as nvlink_nvml
from sentinel.components.nvml_read import (
    FieldAnswers,
    FieldRequest,
    GpuLostError,
    GpuSourceDown,
    GpuUnreachable,
    field_number,
)
from sentinel.components.registry import GPU_SIGNALS
from sentinel.components.signal import SlowRead
from sentinel.wire import GpuInfo, GpuSample

#: the GPU signals' NVML reads, in registry order
_READS = [s.nvml for s in GPU_SIGNALS if s.nvml is not None]
_FAST = [r.fast for r in _READS if r.fast is not None]
_SLOW = [r.slow for r in _READS if r.slow is not None]
_FIELDS = [r.fields for r in _READS if r.fields is not None]

ErrorHook = Callable[[str, str], None]

#: failed calls (none answered) in one read of a GPU that make it unreachable; a read asks more than this of
#: any GPU NVML can serve, so a few calls failing on their own never do
UNREACHABLE_AFTER = 4
#: batched calls whose own success says nothing of the GPU: their values count one by one
_COUNTED_BY_VALUE = frozenset({"field_values"})

_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
_FIELD_UNSUPPORTED = frozenset({_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})
_XID_EVENT = pynvml.nvmlEventTypeXidCriticalError
#: NVML as a whole is gone (a driver reload, a GPU reset that took the library's state with it)
_SOURCE_DOWN = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        getattr(pynvml, "NVML_ERROR_RESET_REQUIRED", 26),
    }
)


class _HandleRenewed(Exception):
    """A GPU's handle was stale and has been replaced: the read under way starts again on the new one."""


def _missing_from_pynvml(exc: AttributeError) -> bool:
    """An attribute this nvidia-ml-py lacks (an older release), not a bug of ours."""
    return getattr(exc, "obj", None) is pynvml


def _pointer_value(handle: Any) -> int:
    """The address an NVML handle (a ctypes pointer) holds, to recognise it in event data."""
    value = ctypes.cast(handle, ctypes.c_void_p).value
    return int(value or 0)


class NvmlSource:
    """:class:`sentinel.agent.source.GpuSource` over NVML."""

    def __init__(self, on_error: ErrorHook | None = None, *, max_links: int = nvlink_nvml.MAX_LINKS) -> None:
        self._on_error = on_error
        self._max_links = max_links
        self._handles: list[Any] = []
        self._handle_index: dict[int, int] = {}
        self._uuids: dict[int, str] = {}
        self._links: dict[int, list[int]] = {}
        self._unsupported: set[tuple[int, str]] = set()
        #: GPUs whose reads answered RESET_REQUIRED in the read under way
        self._reset_required: set[int] = set()
        #: per GPU, the read under way's calls answered, calls failed, and the first failure
        self._calls: dict[int, tuple[int, int, str]] = {}
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
            answer = fn(*args)
        except AttributeError as exc:
            if not _missing_from_pynvml(exc):
                raise
            with self._lock:
                self._unsupported.add(key)
            return None
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                with self._lock:
                    self._unsupported.add(key)
                return None
            if gpu >= 0 and code in (_GPU_IS_LOST, _INVALID_ARGUMENT):
                self._renew(gpu, code, fn.__name__)
            self._report(fn.__name__, exc)
            if code == _INVALID_ARGUMENT and gpu >= 0:
                # the handle is current: the argument is one this driver does not know (a newer enum value),
                # as for field ids; not asked again
                with self._lock:
                    self._unsupported.add(key)
                return None
            if code == _RESET_REQUIRED and gpu >= 0:
                with self._lock:
                    self._reset_required.add(gpu)
                return None
            if code in _SOURCE_DOWN:
                raise GpuSourceDown(f"{fn.__name__}: {exc}") from None
            self._count(gpu, answered=False, what=f"{fn.__name__}: {exc}")
            return None
        except pynvml.NVMLLibraryMismatchError:
            with self._lock:
                self._unsupported.add(key)
            return None
        if field not in _COUNTED_BY_VALUE:
            self._count(gpu, answered=True)
        return answer

    def _count(self, gpu: int, *, answered: bool, what: str = "") -> None:
        """One call of the read under way on ``gpu`` answered or failed (not NOT_SUPPORTED)."""
        if gpu < 0:
            return
        with self._lock:
            ok, failed, first = self._calls.get(gpu, (0, 0, ""))
            self._calls[gpu] = (ok + 1, failed, first) if answered else (ok, failed + 1, first or what)

    def _reachable(self, gpu: int) -> None:
        """Raise :class:`GpuUnreachable` when the read under way had no call answered and enough failed."""
        with self._lock:
            ok, failed, first = self._calls.get(gpu, (0, 0, ""))
        if ok == 0 and failed >= UNREACHABLE_AFTER:
            raise GpuUnreachable(f"GPU {gpu}: all {failed} NVML calls of the read failed, e.g. {first}")

    def field_values(self, gpu: int, handle: Any, requests: list[FieldRequest]) -> FieldAnswers:
        """One ``nvmlDeviceGetFieldValues`` call for every request not known to be unsupported.

        NVML answers each value with its own return code: NOT_SUPPORTED (or INVALID_ARGUMENT, which older
        drivers answer for a field id they do not know) is remembered under the request's name for this GPU
        and never asked again; GPU_IS_LOST anywhere means the GPU is lost; any other per-value error is
        counted and the value left out. The call itself goes through :meth:`_get` (its own error model).
        """
        skip = self._unsupported
        wanted = [r for r in requests if (gpu, r[0]) not in skip]
        if not wanted:
            return {}
        values = self._get(
            gpu, "field_values", pynvml.nvmlDeviceGetFieldValues, handle, [(f, s) for _, f, s in wanted]
        )
        if values is None:
            return {}
        out: FieldAnswers = {}
        unsupported: list[str] = []
        for (name, _, _), value in zip(wanted, values, strict=True):
            code = int(value.nvmlReturn)
            if code == pynvml.NVML_SUCCESS:
                self._count(gpu, answered=True)
                number = field_number(value)
                if number is not None:
                    out[name] = number
            elif code in _FIELD_UNSUPPORTED:
                unsupported.append(name)
            elif code == _GPU_IS_LOST:
                self._renew(gpu, code, "nvmlDeviceGetFieldValues")
            else:
                self._report("nvmlDeviceGetFieldValues", pynvml.NVMLError(code))
                self._count(gpu, answered=False, what=f"nvmlDeviceGetFieldValues: {pynvml.NVMLError(code)}")
        if unsupported:
            with self._lock:
                self._unsupported.update((gpu, name) for name in unsupported)
        return out

    def _renew(self, gpu: int, code: int, function: str) -> None:
        """A GPU's call answered GPU_IS_LOST or INVALID_ARGUMENT: is its handle stale? Returns when the handle
        is current (the argument was invalid); raises :class:`_HandleRenewed` after replacing a stale handle
        of the same GPU, :class:`GpuSourceDown` when another GPU answers at the index, :class:`GpuLostError`
        when the GPU answers nothing."""
        lost = GpuLostError(f"GPU {gpu}: {function}: GPU is lost")
        old = self._handles[gpu] if 0 <= gpu < len(self._handles) else None
        try:
            new = pynvml.nvmlDeviceGetHandleByIndex(gpu)
            uuid = device_nvml.text(pynvml.nvmlDeviceGetUUID(new))
        except pynvml.NVMLError as exc:
            again = getattr(exc, "value", None)
            if again in _SOURCE_DOWN:
                raise GpuSourceDown(f"nvmlDeviceGetHandleByIndex: {exc}") from None
            if _GPU_IS_LOST in (code, again):
                raise lost from None
            return
        if old is not None and _pointer_value(new) == _pointer_value(old):
            if code == _GPU_IS_LOST:
                raise lost
            return
        if uuid != self._uuids.get(gpu):
            raise GpuSourceDown(f"GPU {gpu}: {uuid or 'another GPU'} answers at this index: the GPUs changed")
        with self._lock:
            self._handles[gpu] = new
            self._handle_index = {_pointer_value(h): i for i, h in enumerate(self._handles) if h is not None}
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlDeviceRegisterEvents(new, _XID_EVENT, self._event_set)
        raise _HandleRenewed

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
        driver = device_nvml.text(self._get(-1, "driver", pynvml.nvmlSystemGetDriverVersion) or "")
        count = int(pynvml.nvmlDeviceGetCount())
        # each GPU on its own: one whose handle fails is reported (unavailable, with the NVML error) and the
        # others are monitored
        self._handles = []
        inventory: list[GpuInfo] = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:
                self._report("nvmlDeviceGetHandleByIndex", exc)
                self._handles.append(None)
                inventory.append(
                    GpuInfo(index=index, uuid="", pci_bus="", driver=driver, error=str(exc)[:200])
                )
                continue
            self._handles.append(handle)
            inventory.append(self._identity(index, handle, driver))
        self._handle_index = {_pointer_value(h): i for i, h in enumerate(self._handles) if h is not None}
        self._uuids = {g.index: g.uuid for g in inventory}
        self._setup_events()
        return inventory

    def _identity(self, index: int, handle: Any, driver: str) -> GpuInfo:
        try:
            links = nvlink_nvml.probe_links(index, handle, self._max_links)
            info = device_nvml.identity(self._get, index, handle, driver, len(links))
        except GpuLostError:
            return GpuInfo(index=index, uuid="", pci_bus="", driver=driver)
        self._links[index] = links
        return info

    def _setup_events(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._report("nvmlEventSetCreate", exc)
            return
        registered = 0
        for index, handle in enumerate(self._handles):
            if handle is None:
                continue
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
        if not 0 <= gpu < len(self._handles) or self._handles[gpu] is None:
            raise GpuLostError(f"GPU {gpu}: no such GPU")
        return self._handles[gpu]

    def read_fast(self, gpu: int, now: float) -> GpuSample:
        return self._renewing(gpu, lambda: self._read_fast(gpu, now))

    def read_slow(self, gpu: int, now: float) -> GpuSample:
        return self._renewing(gpu, lambda: self._read_slow(gpu, now))

    def _renewing(self, gpu: int, read: Callable[[], GpuSample]) -> GpuSample:
        """``read``, again once on the new handle when the old one turned out stale."""
        try:
            return read()
        except _HandleRenewed:
            pass
        try:
            return read()
        except _HandleRenewed:
            raise GpuSourceDown(f"GPU {gpu}: its handle went stale twice in one read") from None

    def _part(self, read: Callable[[], Any]) -> Any:
        """One signal's read; None when it needs what this nvidia-ml-py lacks (an older release)."""
        try:
            return read()
        except AttributeError as exc:
            if not _missing_from_pynvml(exc):
                raise
            self._report(f"pynvml.{exc.name}", exc)
            return None

    def _read_fast(self, gpu: int, now: float) -> GpuSample:
        """Every GPU signal's fast NVML read, in registry order."""
        h = self._handle(gpu)
        with self._lock:
            self._reset_required.discard(gpu)
            self._calls.pop(gpu, None)
        sample = GpuSample(gpu=gpu, t=now)
        for fast in _FAST:
            self._part(partial(fast, self._get, gpu, h, sample))
        self._needs_reset(gpu, sample)
        self._reachable(gpu)
        return sample

    def _needs_reset(self, gpu: int, sample: GpuSample) -> None:
        """A GPU whose reads answered RESET_REQUIRED: the driver's own recovery action, unless it named one."""
        if gpu in self._reset_required and sample.recovery_action in (None, "none"):
            sample.recovery_action = "gpu_reset"

    def _read_slow(self, gpu: int, now: float) -> GpuSample:
        """The fast reads, then every GPU signal's slow read, in registry order."""
        sample = self._read_fast(gpu, now)
        h = self._handle(gpu)
        links = self._links.get(gpu) or []
        # one field-values call per GPU for every signal's fields (all links' counters included)
        requests = [request for fields in _FIELDS for request in fields(links)]
        read = SlowRead(
            get=self._get, gpu=gpu, handle=h, links=links, values=self.field_values(gpu, h, requests)
        )
        for slow in _SLOW:
            self._part(partial(slow, read, sample))
        self._needs_reset(gpu, sample)
        self._reachable(gpu)
        return sample

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
        self._handles, self._handle_index, self._uuids = [], {}, {}

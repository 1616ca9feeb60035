"""The calling convention every component's ``nvml.py`` reads through.

A component's NVML read is a plain function ``read(get, gpu, handle) -> Record | None``. ``get`` is the
GPU source's error model (:meth:`sentinel.agent.nvml.NvmlSource._get`): it calls one pynvml function and
returns ``None`` when the field is NOT_SUPPORTED (remembered per GPU and field, never asked again) or
failed (counted in a metric), and raises :class:`GpuLostError` when the GPU fell off the bus. So a
component says only *what* to read and how to shape it; *how NVML fails* lives in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class GpuLostError(Exception):
    """The GPU is gone (fallen off the bus); every further call on it will fail."""


class GpuUnreachable(Exception):
    """Every NVML call of a read on this GPU failed (NVML_ERROR_UNKNOWN and the like) and none answered: the
    GPU still has its handle but the driver serves nothing on it."""


class Get(Protocol):
    def __call__(self, gpu: int, field: str, fn: Callable[..., Any], /, *args: Any) -> Any: ...


class GpuSourceDown(Exception):
    """NVML as a whole stopped working (uninitialised, driver not loaded or reloaded): re-initialise it."""


#: one requested NVML field value: (name, field id, scope id). ``name`` is what NOT_SUPPORTED is remembered
#: under (per GPU) and what ``sentinel agent once`` lists, e.g. ``nvlink3.replay``; the scope is the link for
#: per-link NVLink fields and 0 for device-wide ones.
FieldRequest = tuple[str, int, int]
#: answered values by name; a field NVML did not answer is absent
FieldAnswers = dict[str, float]


class FieldValues(Protocol):
    """The GPU source's batched read: one ``nvmlDeviceGetFieldValues`` call for every request of a GPU
    (:meth:`sentinel.agent.nvml.NvmlSource.field_values`). NVML answers per value; a value answering
    NOT_SUPPORTED is remembered per GPU and name and not asked again."""

    def __call__(self, gpu: int, handle: Any, requests: list[FieldRequest], /) -> FieldAnswers: ...


def field_number(value: Any) -> float | None:
    """The number in an ``nvmlFieldValue_t`` by its ``valueType`` (NVML_VALUE_TYPE_*); None for a type this
    build does not know (never guess which union member holds it)."""
    kind = int(value.valueType)
    union = value.value
    member = _VALUE_MEMBERS.get(kind)
    if member is None:
        return None
    return float(getattr(union, member))


#: NVML_VALUE_TYPE_* → the member of ``c_nvmlValue_t`` that holds it
_VALUE_MEMBERS: dict[int, str] = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

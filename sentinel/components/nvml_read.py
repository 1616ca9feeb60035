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


class Get(Protocol):
    def __call__(self, gpu: int, field: str, fn: Callable[..., Any], /, *args: Any) -> Any: ...


class FieldUnsupported(Exception):
    """Raised by a read helper when NVML answered for the call but not for this field (a field-value read's
    per-value NOT_SUPPORTED): ``get`` remembers it like a NOT_SUPPORTED return."""


class GpuSourceDown(Exception):
    """NVML as a whole stopped working (uninitialised, driver not loaded or reloaded): re-initialise it."""

"""A GPU's identity and its NVML state: the records of the device component."""

from __future__ import annotations

from typing import Literal

import msgspec

from sentinel.components.bounds import Short

#: ``lost``: NVML_ERROR_GPU_IS_LOST (fallen off the bus); ``unresponsive``: a call did not return within the
#: agent's deadline; ``unavailable``: NVML could not open it (its handle or identity failed), or every call of
#: a read failed (NVML_ERROR_UNKNOWN throughout: the driver serves nothing on it).
GpuState = Literal["ok", "lost", "unresponsive", "unavailable"]


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Identity of one GPU, sent in the hello."""

    index: int
    uuid: Short
    pci_bus: Short  # dddd:bb:dd lower-case
    name: Short = ""
    serial: Short = ""
    driver: Short = ""
    vbios: Short = ""
    memory_total_bytes: int = 0
    nvlinks: int = 0
    #: set when NVML could not open this GPU (its handle or identity failed): the NVML error
    error: Short = ""


class GpuSourceHealth(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Whether the host's GPU source works: sent in the hello and in a batch whenever it changes.

    ``error`` is set while NVML cannot be used at all (not loaded, init failing); ``found`` GPUs answered
    the last open, ``expected`` is what the host should have (configured, or learned from its first
    inventory and kept in the state directory).
    """

    ok: bool = True
    error: Short = ""
    expected: int = 0
    found: int = 0

"""The outcome of a GPU memory-health rule (row remapping, ECC, retired pages)."""

from __future__ import annotations

from typing import Literal

import msgspec

from sentinel.signals.xid_catalog import Action, Severity

GpuState = Literal["ok", "suspect", "faulty"]


class MemoryFinding(msgspec.Struct, frozen=True, kw_only=True):
    """What one memory-health sample says about a GPU."""

    state: GpuState
    severity: Severity
    action: Action
    #: Short machine-readable code, e.g. ``row_remap_pending``, ``ecc_uncorrected_volatile``.
    reason: str
    #: Human-readable facts that led to the decision.
    evidence: tuple[str, ...] = ()

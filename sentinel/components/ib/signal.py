"""The ib signal: InfiniBand / RoCE ports, a host-level source — its own collector (sysfs), its own
detector (``network``: the port rule's findings joined to hosts, GPUs and ranks)."""

from __future__ import annotations

from sentinel.components.ib.collector import build
from sentinel.components.signal import Signal

SIGNAL = Signal[None](
    name="ib",
    summary="InfiniBand / RoCE ports from sysfs: links down, flaps, error rates; the port behind a stall",
    scope="host",
    collector="ib",
    collect=build,
    detector="network",
)

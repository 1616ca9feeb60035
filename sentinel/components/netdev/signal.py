"""The netdev signal: network interfaces from sysfs, a host-level source — its own collector (``netdev``:
``statistics/`` and the root qdisc), judged with the IB ports by the ``link_pace`` detector (a job's link
that stands out while the job runs slower in communication)."""

from __future__ import annotations

from sentinel.components.netdev.collector import build
from sentinel.components.signal import Signal

SIGNAL = Signal[None](
    name="netdev",
    summary="network interfaces from sysfs and their qdiscs: the TCP link that slows a job",
    scope="host",
    collector="netdev",
    collect=build,
    detector="link_pace",
)

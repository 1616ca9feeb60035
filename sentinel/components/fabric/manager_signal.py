"""The fabric_manager signal: the host's nvidia-fabricmanager service, a host-level source — its own
collector (``fabric_manager``: the unit's state through systemd), judged per host by the ``host_health``
detector (``components/fabric/host.py``)."""

from __future__ import annotations

from sentinel.components.fabric.collector import build
from sentinel.components.signal import Signal

SIGNAL = Signal[None](
    name="fabric_manager",
    component="fabric",
    summary="the NVSwitch fabric manager's service state: a host whose fabric manager is down",
    scope="host",
    collector="fabric_manager",
    collect=build,
    detector="host_health",
)

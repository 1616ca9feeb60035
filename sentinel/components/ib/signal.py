"""The ib signal: InfiniBand / RoCE ports, a host-level source — its collector reads sysfs, its judgement
(``network``: the port rule's findings joined to hosts, GPUs and ranks) runs on every host's latest ports."""

from __future__ import annotations

from sentinel.components.ib.collector import build
from sentinel.components.ib.judge import judge_host, reading_t
from sentinel.components.signal import Signal

SIGNAL = Signal[None](
    name="ib",
    summary="InfiniBand / RoCE ports from sysfs: links down, flaps, error rates; the port behind a stall",
    scope="host",
    collector="ib",
    collect=build,
    detector="network",
    judge_host=judge_host,
    reading_t=reading_t,
)

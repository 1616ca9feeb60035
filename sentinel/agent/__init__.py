"""The per-host agent: NVML and event collection, ring buffer, /metrics, streaming to the aggregator.

Public API: :class:`Agent` (``Agent(config, source, extras=None, clock=time.time)``), the
:class:`GpuSource` / :class:`HostExtras` interfaces in :mod:`sentinel.agent.source`, and
:class:`sentinel.agent.nvml.NvmlSource` for real GPUs.
"""

from sentinel.agent.agent import Agent
from sentinel.agent.source import GpuLostError, GpuSource, HostExtras, XidEvent, XidRecord

__all__ = ["Agent", "GpuLostError", "GpuSource", "HostExtras", "XidEvent", "XidRecord"]

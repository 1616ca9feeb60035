"""The per-host agent: NVML and event collection, ring buffer, /metrics, streaming to the aggregator.

Public API: :class:`Agent` (``Agent(config, source, inputs=None, clock=time.time)``), the
:class:`GpuSource` / :class:`HostInputs` interfaces in :mod:`sentinel.agent.source`, and
:class:`sentinel.agent.nvml.NvmlSource` for real GPUs.
"""

from typing import TYPE_CHECKING, Any

from sentinel.agent.source import GpuLostError, GpuSource, HostInputs, XidEvent, XidRecord

if TYPE_CHECKING:
    from sentinel.agent.agent import Agent


def __getattr__(name: str) -> Any:
    # Imported on first use: importing the package (its GPU-source interface) must not build the whole agent.
    if name == "Agent":
        from sentinel.agent.agent import Agent

        return Agent
    raise AttributeError(name)


__all__ = ["Agent", "GpuLostError", "GpuSource", "HostInputs", "XidEvent", "XidRecord"]

"""Real GPUs through NVML (nvidia-ml-py): the GPU source that runs every component's NVML read."""

from sentinel.agent.nvml.source import NvmlSource

__all__ = ["NvmlSource"]

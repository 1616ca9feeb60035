"""Real GPUs through NVML (nvidia-ml-py)."""

from sentinel.agent.nvml.source import THROTTLE_REASONS, NvmlSource, normalize_pci_bus

__all__ = ["THROTTLE_REASONS", "NvmlSource", "normalize_pci_bus"]

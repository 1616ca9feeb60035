"""PCIe: ``nvml.py`` reads the replay counter and throughput (``GpuSample.pcie_*``); ``metrics.py`` exports
them; ``rule.py`` decides (replays climbing → degraded, drain).
"""

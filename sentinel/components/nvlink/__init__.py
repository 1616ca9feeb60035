"""NVLink: ``nvml.py`` finds the GPU's links once and reads state and error counters into
``record.NvLink`` (``GpuSample.nvlink``); ``metrics.py`` exports them; ``rule.py`` decides (a link down →
degraded, reset; error counters climbing → degraded). The aggregator measures the rate from their history.
"""

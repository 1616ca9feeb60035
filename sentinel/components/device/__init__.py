"""NVML device health: ``nvml.py`` reads a GPU's identity (``record.GpuInfo``, sent in the hello) and its
utilisation, memory and processes; the agent's GPU collector tracks each GPU's ``record.GpuState`` (ok,
lost, unresponsive, unavailable); ``metrics.py`` exports identity and state; ``rule.py`` turns a lost,
hung or unopenable GPU into a faulty verdict.
"""

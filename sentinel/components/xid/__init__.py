"""Xid: the driver's error codes, from NVML's event set and the kernel log, as one event each.

Life of an Xid: the kernel prints ``NVRM: Xid (PCI:...): 79, pid=..., ...`` and NVML's event set reports
(gpu, 79). ``parse.py`` reads the kernel line (pid, process, text, sub-codes, severity refined by the line);
``catalog.py`` is the only source of severity and action for every code (all of NVIDIA's catalog);
``merge.py`` (in the agent's tick) joins the two reports of one occurrence after a short bounded wait,
keeping the kernel line's detail and NVML's timing; ``metrics.py`` counts occurrences labelled with the
catalog severity (alert rules match that label); ``rule.py`` is the per-GPU policy (faulty at once, or
suspect after repeats from distinct processes), latched until a real reset or a new boot.
"""

"""ECC counters and retired pages: ``nvml.py`` reads them into ``record.EccCounters`` / ``RetiredPages``
(``GpuSample.ecc`` / ``.retired``); ``parse.py`` reads the same records from ``nvidia-smi -q`` text;
``metrics.py`` exports them; ``rule.py`` decides (uncorrected since reset → faulty, SRAM over threshold →
RMA, retired pages at the limit → RMA, pending retirement → reset).
"""

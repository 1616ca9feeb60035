"""Row remapping (Ampere+): ``nvml.py`` reads the remapped-row counters and the bank histogram into the
``record.RowRemap`` that rides in ``GpuSample.remap``; ``parse.py`` reads the same record from
``nvidia-smi -q`` text; ``metrics.py`` exports it; ``rule.py`` decides (failure → RMA, pending with
uncorrectable → faulty until reset, pending → reset soon, rising / few spares → early warning).
"""

"""Signals as components: one package per signal, holding its whole life.

Each package (GPU: ``xid``, ``rowremap``, ``ecc``, ``nvlink``, ``pcie``, ``clocks``, ``fabric``,
``device``; network: ``ib``, ``nccl_ras``, ``nccl_debug``) has its typed record, its read or parser, its
metrics and a pure ``rule.py`` (records and time in, findings out). Shared: :mod:`.vocab`,
:mod:`.registry`, :mod:`.nvml_read`, :mod:`.exposition`. This package imports nothing on purpose:
``sentinel.wire`` imports the records, and the registry imports the metrics.
"""

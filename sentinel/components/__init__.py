"""Signals as components: one package per signal, holding its whole life.

GPU: ``xid``, ``rowremap``, ``ecc`` (ECC + retired pages), ``nvlink``, ``pcie``, ``clocks`` (clocks,
throttle, thermal, power), ``fabric`` (NVLink fabric / fabric manager registration) and ``device`` (NVML
device health, GPU count). Network: ``ib`` (InfiniBand / RoCE ports from sysfs), ``nccl_ras`` (NCCL's RAS
service), ``nccl_debug`` (async-debug readiness of a job's ranks). Each has ``record.py`` (the typed record: the same struct on the wire and in the rules),
``nvml.py`` (its NVML read) and/or ``parse.py`` (its text parser), ``metrics.py`` (its metric families) and
``rule.py`` (pure policy: records and time in, findings with severity / action / reason / evidence out).
Tests: ``tests/components/<name>/``.

Shared: :mod:`.vocab` (Severity, Action, VerdictKind — one vocabulary for verdicts, metrics and alerts),
:mod:`.registry` (the list the agent, docs and the aggregator go through), :mod:`.nvml_read` (how a read
meets NVML's error model), :mod:`.exposition` (how a component writes its metric families).

This package imports nothing on purpose: ``sentinel.wire`` imports the records, and the registry imports
the metrics (which import ``sentinel.wire``).
"""

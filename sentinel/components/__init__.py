"""Signals as components: one package per signal, holding its whole life (reader, typed record, metrics,
rule). ``ib`` (InfiniBand / RoCE ports from sysfs), ``nccl_ras`` (NCCL's RAS service), ``nccl_debug``
(async-debug readiness of a job's ranks)."""

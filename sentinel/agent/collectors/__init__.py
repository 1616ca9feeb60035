"""The agent's collectors, node_exporter style: one module per collector family over a shared contract.

:mod:`.base` is what they feed (:class:`~.base.AgentSink`) and the tick's runner over the collector contract
(:mod:`sentinel.components.collector`);
:mod:`.gpu` (NVML), :mod:`.xid`, :mod:`.lines` (kernel log and job logs), :mod:`.jobs`,
:mod:`.flight_recorder` (probe heads and dump files) are the agent's own; the host-level signals build
theirs (each signal's ``collect``: ``components/ib/collector.py``, ``netdev``, ``nccl_ras``). Which exist and how the
configuration builds each: :mod:`sentinel.agent.registry`.
"""

"""The agent's collectors, node_exporter style: one module per collector family over a shared contract.

:mod:`.base` is what they feed (:class:`~.base.AgentSink`) and the tick's runner over the collector contract
(:mod:`sentinel.components.collector`);
:mod:`.gpu` (NVML), :mod:`.xid`, :mod:`.lines` (kernel log and job logs), :mod:`.jobs`,
:mod:`.flight_recorder` (probe heads and dump files) are the agent's own; the network components bring
theirs (``components/ib/collector.py``, ``components/nccl_ras/collector.py``). Which exist and how the
configuration builds each: :mod:`sentinel.agent.registry`.
"""

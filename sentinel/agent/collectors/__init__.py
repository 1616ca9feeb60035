"""The agent's collectors, node_exporter style: one module per collector family over a shared contract.

:mod:`.base` is the contract (:class:`~.base.Collector`, :class:`~.base.AgentSink`, the tick's runner);
:mod:`.gpu` (NVML), :mod:`.xid`, :mod:`.lines` (kernel log and job logs), :mod:`.jobs`,
:mod:`.flight_recorder` (probe heads and dump files) are the agent's own; the network components bring
theirs (``components/ib/collector.py``, ``components/nccl_ras/collector.py``). Which exist and how the
configuration builds each: :mod:`sentinel.agent.registry`.
"""

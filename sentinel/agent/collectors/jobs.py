"""The ``jobs`` collector: which job and rank each process NVML sees on a GPU belongs to.

The mapping (process environment, else the Slurm cgroup and ``scontrol listpids``) can block on a process
stuck in the driver, so it runs in the collector's worker with a deadline.
"""

from __future__ import annotations

from sentinel.agent.collectors.base import AgentSink
from sentinel.agent.jobs import JobMapper
from sentinel.components.collector import Collector


class JobsCollector(Collector):
    """Maps the pids NVML sees on each GPU to jobs and ranks (psutil, off the loop)."""

    name = "jobs"

    def __init__(self, sink: AgentSink, mapper: JobMapper, interval_s: float) -> None:
        super().__init__(interval_s)
        self.sink = sink
        self.mapper = mapper

    async def collect(self, now: float) -> None:
        pids = {
            i: list(v.fast.pids) for i, v in self.sink.gpus.items() if v.fast is not None and v.state == "ok"
        }
        procs = await self.blocking(lambda: self.mapper.map(pids))
        self.sink.set_procs(procs)

"""What the real agent would send for a simulated host, produced without threads or waiting.

The virtual-clock runner uses this instead of running :mod:`sentinel.agent` so that thousands of hosts fit
in one process: the same wire frames (:class:`~sentinel.wire.Hello`, :class:`~sentinel.wire.Batch`) with the
same meaning — a hung NVML call shows up as ``unresponsive`` once the agent's deadline has passed (the GPU is
simply missing from the batches before that), a lost GPU as ``lost`` plus a ``gpu_lost`` event, Xids as NVML
events, NCCL log lines as classified ``log`` events, the job mapping when it changes and flight-recorder
heads at the probe's cadence.
"""

from __future__ import annotations

from sentinel.agent.classify import LineClassifier
from sentinel.components.ib.record import IbPort
from sentinel.components.ib.tracker import PortTracker
from sentinel.sim.cluster import ClusterSim, HostSim
from sentinel.wire import Batch, Event, GpuSample, Hello, ProcInfo

NVML_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 2.0
PORTS_INTERVAL_S = 2.0  # the agent's ib.interval_s
_classify = LineClassifier()


class VirtualAgent:
    def __init__(
        self,
        cluster: ClusterSim,
        host: HostSim,
        *,
        nvml_timeout_s: float = NVML_TIMEOUT_S,
        probe_interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.nvml_timeout_s = nvml_timeout_s
        self.probe_interval_s = probe_interval_s
        self.seq = 0
        self._next_heads = 0.0
        self._procs_version = -1
        self._reported: set[tuple[int, str]] = set()  # (gpu, state) already announced by an event
        self.ports = PortTracker()  # the real agent's port history, in memory
        self._next_ports = 0.0

    def hello(self, t: float) -> Hello:
        return Hello(
            host=self.host.name,
            boot_id=f"boot-{self.host.index}",
            started_at=t,
            tick_s=self.cluster.tick_s,
            gpus=self.cluster.inventory(self.host),
            next_seq=self.seq,
        )

    @property
    def down(self) -> bool:
        return self.cluster.now >= self.host.down_at

    def collect(self, t: float) -> Batch | None:
        """This tick's batch (None once the host is down)."""
        host = self.host
        if t >= host.down_at:
            return None
        cluster = self.cluster
        samples: list[GpuSample] = []
        events: list[Event] = []
        for gpu in host.gpus:
            if t >= gpu.lost_at:
                samples.append(GpuSample(gpu=gpu.index, t=t, state="lost"))
                if (gpu.index, "lost") not in self._reported:
                    self._reported.add((gpu.index, "lost"))
                    events.append(
                        Event(
                            t=t,
                            kind="gpu_lost",
                            source="nvml",
                            gpu=gpu.index,
                            severity="critical",
                            text="GPU is lost",
                        )
                    )
            elif t >= gpu.nvml_hang_at:
                if t - gpu.nvml_hang_at >= self.nvml_timeout_s:
                    samples.append(GpuSample(gpu=gpu.index, t=t, state="unresponsive"))
                    if (gpu.index, "unresponsive") not in self._reported:
                        self._reported.add((gpu.index, "unresponsive"))
                        events.append(
                            Event(
                                t=t,
                                kind="gpu_unresponsive",
                                source="agent",
                                gpu=gpu.index,
                                severity="critical",
                                text=f"NVML call did not return within {self.nvml_timeout_s:g}s",
                            )
                        )
            else:
                samples.append(cluster.sample(host, gpu, t, slow=True))
        if host.xids:
            due = [x for x in host.xids if x[0] <= t]
            host.xids = [x for x in host.xids if x[0] > t]
            for xt, gpu_index, xid, text in due:
                events.append(
                    Event(
                        t=xt,
                        kind="xid",
                        source="nvml",
                        gpu=gpu_index,
                        xid=xid,
                        severity="critical",
                        text=text,
                    )
                )
            host.kernel_lines.clear()  # the agent deduplicates kmsg against the NVML event
        if host.job_lines:
            for lt, _gpu, line in host.job_lines:  # the agent cannot tell the GPU from an NCCL line
                events.append(
                    Event(
                        t=lt,
                        kind="log",
                        source="log:nccl",
                        severity="warning",
                        text=line,
                        fields={"kind": "nccl_warn_net", "severity": "warning"},
                    )
                )
            host.job_lines.clear()
        for line in host.ib_kernel_lines:  # mlx5 messages go through the agent's classifier like kmsg
            result = _classify(line)
            if result is not None and result.severity != "info":
                events.append(
                    Event(
                        t=t,
                        kind="log",
                        source="kmsg",
                        severity="critical" if result.severity == "critical" else "warning",
                        text=line,
                        fields={**result.fields, "kind": result.kind},
                    )
                )
        host.ib_kernel_lines.clear()
        ports: list[IbPort] | None = None
        if t >= self._next_ports:
            self._next_ports = t + PORTS_INTERVAL_S - 1e-9
            ports = self.ports.update(cluster.port_scan(host, t).ports, t)
        procs: list[ProcInfo] | None = None
        if host.procs_version != self._procs_version:
            self._procs_version = host.procs_version
            procs = cluster.processes(host, t)
        heads = []
        if t >= self._next_heads:
            self._next_heads = t + self.probe_interval_s - 1e-9
            heads = cluster.heads(host, t)
        batch = Batch(
            seq=self.seq, t=t, samples=samples, events=events, procs=procs, heads=heads, ports=ports
        )
        self.seq += 1
        return batch

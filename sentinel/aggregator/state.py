"""Fleet state: hosts, GPUs, jobs and ranks as the agents' batches describe them.

Ingest is the hot path (49,152 GPUs at 1 Hz on one core), so applying a batch does the least that the
detectors need: latest readings, a few moving averages, latched hardware facts, bounded histories. Every
structure is bounded (per-host dedup window, event deques, rate histories), so a misbehaving agent cannot
grow the aggregator's memory. Each GPU is a :class:`~sentinel.components.gpu_view.GpuView`, updated by the
same functions the agent's ``sentinel health`` uses for its own GPUs.

Times: ``now`` is the aggregator's clock (injected: wall time in the server, virtual time in ``sentinel
sim``); sample and heads times are the agent's clock and are only compared with each other.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import msgspec

from sentinel.aggregator.claims import MAX_WAITING_CLAIMS, CountedRefusals, RefusalSink, may_speak_for
from sentinel.aggregator.clock import HostClock
from sentinel.aggregator.streams import adopt_instance
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.fabric.host import SwitchMemory
from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.components.gpu_view import (
    GpuView,
    apply_gpu_event,
    apply_sample,
    apply_xid_in_burst,
    fit_inventory,
)
from sentinel.components.ib.hca import HcaMemory
from sentinel.components.ib.kernel import host_evidence
from sentinel.components.ib.record import IbPort
from sentinel.components.nccl_debug.record import DebugReadiness
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.components.netdev.record import Netdev
from sentinel.components.signal import JudgeSettings
from sentinel.components.xid.rule import XidPolicyConfig
from sentinel.components.xid.storm import XidStorms
from sentinel.fr.heads import FrHeads
from sentinel.wire import (
    Batch,
    Drops,
    Event,
    GpuInfo,
    GpuStateChanged,
    GpuWasReset,
    Hello,
    LogLine,
    ProcInfo,
    XidOccurred,
)

DEDUP_WINDOW = 4096  # seqs above the contiguous high-water mark remembered per host
HOST_EVENTS_KEPT = 256
MAX_PORTS_PER_HOST = 64
MAX_RAS_PER_BATCH = 16
MAX_DEBUG_HOSTS_PER_JOB = 4096
HEADS_LOG_SLACK = 1024  # JobView.heads_log entries kept beyond twice the job's ranks
STEP_BASELINE_S = 10.0  # a job's step time is measured over at least this long
#: NCCL's line prefix ``hostname:pid:tid [cudaDev]``: the pid names the process, hence the GPU and rank.


@dataclass(slots=True)
class LogEvent:
    """A classified log event kept per host for the stuck detector (NCCL NET errors, watchdog timeouts)."""

    t: float
    seen_at: float
    kind: str
    gpu: int | None
    rank: int | None
    seq: int | None
    text: str


@dataclass(slots=True)
class HostView:
    name: str
    cluster: str = "default"
    gpus: list[GpuView] = field(default_factory=list)
    boot_id: str = ""
    tick_s: float = 1.0
    connected: bool = False
    last_seen: float = -math.inf  # aggregator clock of the latest frame
    last_t: float = -math.inf  # agent time of the latest batch
    seq_hw: int = -1  # every seq <= seq_hw has been seen
    seq_above: set[int] = field(default_factory=set)
    #: the agent instance (``Hello.instance_id``) whose numbering the window holds ("": not told)
    instance_id: str = ""
    #: a Hello opened a connection and no batch has come on it yet (its first batch closes the gap below it)
    stream_fresh: bool = False
    events: deque[LogEvent] = field(default_factory=lambda: deque(maxlen=HOST_EVENTS_KEPT))
    procs: list[ProcInfo] = field(default_factory=list)
    batches: int = 0
    duplicates: int = 0
    #: what the agent reported it had to drop (``Batch.drops``: spool full, oversize events, probe), totals
    drops: dict[str, int] = field(default_factory=dict)
    #: the agent's GPU source health (NVML usable, GPUs found vs expected); None: never reported
    gpu_source: GpuSourceHealth | None = None
    gpu_source_t: float = 0.0
    #: IB/RoCE ports by ``device/port``, the latest reading (agent time ``ports_t``)
    ports: dict[str, IbPort] = field(default_factory=dict)
    ports_t: float = -math.inf
    #: network interfaces by name, the latest reading (agent time ``netdevs_t``)
    netdevs: dict[str, Netdev] = field(default_factory=dict)
    netdevs_t: float = -math.inf
    #: the host's clock against the aggregator's (offset, rate), from its batches' stamps
    clock: HostClock = field(default_factory=HostClock)
    #: bumped when what the inventory detector reads changes: the GPUs (count, model, driver, VBIOS, PCIe
    #: link capability) or the GPU source's health; it rebuilds only those hosts' facts
    inventory_version: int = 0
    #: the NVSwitch driver's SXids by switch since the host's boot (components/fabric/host.py)
    switches: SwitchMemory = field(default_factory=SwitchMemory)
    #: the mlx5 HCA health lines since the host's boot (components/ib/hca.py)
    hcas: HcaMemory = field(default_factory=HcaMemory)
    #: the fabric manager's service state, the latest reading (agent time ``fabric_manager_t``)
    fabric_manager: FabricManagerStatus | None = None
    fabric_manager_t: float = -math.inf

    def restart_numbering(self, next_seq: int) -> None:
        """A new boot: seqs from ``next_seq`` on are new, even below the old high-water mark.

        A reimaged host, or one whose seq file was lost, counts from 0 again; without this its batches would
        be acked as duplicates (and deleted from its spool) until the old mark was passed — days of data.
        A host whose numbering survived the reboot (``next_seq`` above the mark) keeps its window as it is.
        """
        if next_seq <= self.seq_hw:
            self.seq_hw = max(next_seq, 0) - 1
            self.seq_above = set()  # marks of the old numbering, all at or above next_seq

    def stream_starts_at(self, seq: int) -> None:
        """The first batch of a connection: every seq below it is delivered or will never come.

        The agent's shipper sends, on each connection, its unacknowledged batches in seq order from the
        oldest (its spool cursor for this aggregator). Below that first seq everything was acked by this
        aggregator (possibly in the second before a ``kill -9`` whose flush never committed) or dropped from
        the spool. A gap there never fills; kept, it would make every later seq wait above the mark, up to
        ``DEDUP_WINDOW`` of them per host — in memory, and in every flush of the durable window.
        """
        if seq - 1 > self.seq_hw:
            self.seq_above = {s for s in self.seq_above if s >= seq}
            self.seq_hw = self._advance(seq - 1)

    def _advance(self, hw: int) -> int:
        """The high-water mark ``hw`` moved past the seqs above it that now join it (taken out of the set)."""
        above = self.seq_above
        while hw + 1 in above:
            hw += 1
            above.discard(hw)
        return hw

    def seen(self, seq: int) -> bool:
        return seq <= self.seq_hw or seq in self.seq_above

    def mark(self, seq: int) -> None:
        above = self.seq_above
        above.add(seq)
        hw = self._advance(self.seq_hw)
        if len(above) > DEDUP_WINDOW:  # a gap that never fills: give up on it, keep memory bounded
            hw = max(hw, sorted(above)[len(above) - DEDUP_WINDOW])
            self.seq_above = {s for s in above if s > hw}
        self.seq_hw = hw


@dataclass(slots=True)
class RankView:
    rank: int
    host: str | None = None
    gpu: int | None = None
    pid: int | None = None
    alive: bool = True
    heads: FrHeads | None = None
    heads_at: float = -math.inf  # aggregator clock when the heads arrived


@dataclass(slots=True)
class JobView:
    id: str
    world_size: int | None = None
    ranks: dict[int, RankView] = field(default_factory=dict)
    first_seen: float = 0.0
    last_seen: float = 0.0
    pg_progress: dict[str, tuple[int, float]] = field(default_factory=dict)  # pg → (max completed seq, when)
    step_base: dict[str, tuple[int, float]] = field(default_factory=dict)  # pg → (seq, when) step baseline
    last_progress_at: float = -math.inf
    step_s: float | None = None
    heads_version: int = 0  # bumped by every heads applied (detectors compare it to skip quiet jobs)
    #: the ranks of the latest heads applied, oldest first (the last of them came with ``heads_version``):
    #: a detector that remembers the version it last saw folds only these ranks' heads instead of walking
    #: every rank of the job each tick. Bounded: trimmed to its newer half beyond twice the job's ranks.
    heads_log: list[int] = field(default_factory=list)
    #: bumped when the job's collective progress as the stuck detector reads it changes: a rank's heads
    #: entered, started or completed a collective or changed a group (not when they only repeat the same
    #: waits with larger ages), a rank's first heads, its process going or coming back, the world size. The
    #: stuck detector re-examines a stalled job only then (or when time alone can change its answer).
    progress_version: int = 0
    #: pg name → its ranks list as first reported; every rank's heads share that one list
    pg_ranks: dict[str, list[int]] = field(default_factory=dict)
    ras: RasStatus | None = None  # NCCL RAS's latest answer about this job
    ras_at: float = -math.inf  # aggregator clock when it arrived
    debug: dict[str, DebugReadiness] = field(default_factory=dict)  # host → its ranks' readiness

    def running(self, now: float, gone_after_s: float) -> bool:
        """Some rank still runs: its process is reported by an agent, or (known only from its flight-recorder
        heads) its heads are recent. A rank known only from heads never gets a process report saying it
        ended, so without the second clause such a job would never end."""
        return any(
            r.alive and (r.pid is not None or now - r.heads_at <= gone_after_s) for r in self.ranks.values()
        )

    def rank_view(self, rank: int) -> RankView:
        view = self.ranks.get(rank)
        if view is None:
            view = self.ranks[rank] = RankView(rank=rank)
        return view


class FleetState:
    """All hosts, GPUs and jobs; mutated only through its methods (:meth:`hello`, :meth:`apply`, ...).

    Detectors read it and never write it; what they must remember is their own state.
    """

    def __init__(
        self,
        *,
        ema_window_s: float = 15.0,
        max_gpus_per_host: int = 64,
        max_jobs: int = 10000,
        max_ranks_per_job: int = 131072,
        xid_config: XidPolicyConfig | None = None,
        max_clock_skew_s: float = 300.0,
    ) -> None:
        self.hosts: dict[str, HostView] = {}
        self.jobs: dict[str, JobView] = {}
        self.ema_window_s = ema_window_s
        self.max_gpus_per_host = max_gpus_per_host
        self.max_jobs = max_jobs
        self.max_ranks_per_job = max_ranks_per_job
        self.xid_config = xid_config or XidPolicyConfig()
        #: what the GPU signals' event handlers read (the Xid policy's thresholds)
        self.judge_settings = JudgeSettings(xid=self.xid_config)
        #: Xid bursts across the GPUs of one job (else one host): the origin judged, its echoes not
        self.xid_storms = XidStorms(
            window_s=self.xid_config.storm_window_s, min_gpus=self.xid_config.storm_min_gpus
        )
        self.ignored = 0  # jobs/ranks beyond the bounds
        self.dirty_gpus: list[GpuView] = []
        self.unknown_gpu_samples = 0
        self.max_clock_skew_s = max_clock_skew_s
        #: samples, events and heads stamped further ahead of the aggregator's clock than max_clock_skew_s
        self.future_stamped = 0
        #: hosts whose inventory or latched hardware facts changed since the state store last looked
        self.changed_hosts: set[str] = set()
        #: hosts whose dedup window (boot id, seq high-water mark, seqs above it) moved since the store looked
        self.window_changed: set[str] = set()
        #: where a host's claim on another host's rank is counted and logged (the server sets its RefusalLog)
        self.refusals: RefusalSink = CountedRefusals()
        #: (job, rank) → the host whose process report claimed it while another ran it (:mod:`.claims`)
        self.waiting_claims: dict[tuple[str, int], str] = {}
        #: hosts forgotten so far (the state store's holders look for records to delete only when it moved)
        self.forgotten_hosts = 0

    # -- connection -----------------------------------------------------------------------------------

    def hello(self, hello: Hello, now: float) -> HostView:
        host = self.hosts.get(hello.host)
        if host is None:
            host = self.hosts[hello.host] = HostView(name=hello.host)
        host.cluster = hello.cluster
        host.tick_s = hello.tick_s if hello.tick_s > 0 else 1.0
        if host.boot_id and hello.boot_id and hello.boot_id != host.boot_id:
            host.restart_numbering(hello.next_seq)
            host.clock.reset()
            host.switches, host.hcas = SwitchMemory(), HcaMemory()  # a reboot resets switches and HCAs
            for gpu in host.gpus:  # a reboot clears every latched hardware fact
                gpu.clear_latches(hello.started_at or now)
                gpu.state = "ok"
                gpu.dirty = True
                self.dirty_gpus.append(gpu)
        if hello.boot_id and hello.boot_id != host.boot_id:
            self.window_changed.add(host.name)
        if adopt_instance(host, hello):
            self.window_changed.add(host.name)
        host.boot_id = hello.boot_id or host.boot_id
        self._inventory(host, hello.gpus[: self.max_gpus_per_host])
        host.inventory_version += 1
        if hello.gpu_source is not None:
            host.gpu_source, host.gpu_source_t = hello.gpu_source, hello.started_at or now
        host.connected = True
        host.stream_fresh = True
        host.last_seen = now
        self.changed_hosts.add(host.name)
        return host

    def _inventory(self, host: HostView, gpus: list[GpuInfo]) -> None:
        fit_inventory(host.name, host.gpus, gpus, self.max_gpus_per_host)

    def disconnected(self, name: str) -> None:
        host = self.hosts.get(name)
        if host is not None:
            host.connected = False
            self._hand_over_from(name)

    def _hand_over_from(self, name: str) -> None:
        """``name`` let go of its ranks (disconnected, forgotten): claims refused meanwhile take them."""
        for job_id, rank in list(self.waiting_claims):
            job = self.jobs.get(job_id)
            view = job.ranks.get(rank) if job is not None else None
            if view is not None and view.host == name:
                self._hand_over(job_id, rank)

    # -- batches --------------------------------------------------------------------------------------

    def apply(self, host: HostView, batch: Batch, now: float) -> bool:
        """Apply one batch; False when it is a resend already applied (still to be acked)."""
        host.last_seen = now
        if host.stream_fresh:
            host.stream_fresh = False
            host.stream_starts_at(batch.seq)
        if host.seen(batch.seq):
            host.duplicates += 1
            return False
        host.mark(batch.seq)
        self.window_changed.add(host.name)
        host.batches += 1
        host.clock.observe(batch.t, now)
        horizon = now + self.max_clock_skew_s
        if batch.t <= horizon:
            host.last_t = max(host.last_t, batch.t)
        gpus = host.gpus
        n = len(gpus)
        dirty = self.dirty_gpus
        for sample in batch.samples:
            index = sample.gpu
            if not sample.t <= horizon:  # a year ahead (or NaN) would make every later sample look old
                self.future_stamped += 1
            elif 0 <= index < n:
                if apply_sample(gpus[index], sample, now, dirty):
                    host.inventory_version += 1
            elif 0 <= index < self.max_gpus_per_host:
                while len(gpus) <= index:
                    gpus.append(GpuView(host=host.name, index=len(gpus)))
                n = len(gpus)
                host.inventory_version += 1
                if apply_sample(gpus[index], sample, now, dirty):
                    host.inventory_version += 1
            else:
                self.unknown_gpu_samples += 1
        for event in batch.events:
            if not event.t <= horizon:  # the event itself counts, at the time it reached us
                self.future_stamped += 1
                event.t = now
            self._event(host, event, now)
        if batch.gpu_source is not None:
            if batch.gpu_source != host.gpu_source:
                host.inventory_version += 1
            host.gpu_source, host.gpu_source_t = batch.gpu_source, batch.t
        if batch.procs is not None:
            self._procs(host, batch.procs, now)
        if batch.drops is not None:
            _add_drops(host.drops, batch.drops)
        for heads in batch.heads:
            if heads.t <= horizon:
                self._heads(host, heads, now)
            else:
                self.future_stamped += 1
        if batch.ports is not None and host.ports_t <= batch.t <= horizon:
            host.ports = {p.key: p for p in batch.ports[:MAX_PORTS_PER_HOST]}
            host.ports_t = batch.t
        if batch.netdevs is not None and host.netdevs_t <= batch.t <= horizon:
            host.netdevs = {d.name: d for d in batch.netdevs}
            host.netdevs_t = batch.t
        if batch.fabric_manager is not None and host.fabric_manager_t <= batch.t <= horizon:
            host.fabric_manager, host.fabric_manager_t = batch.fabric_manager, batch.t
        for status in batch.ras[:MAX_RAS_PER_BATCH]:
            if status.job:
                job = self._job(status.job, now)
                if job is not None:
                    job.ras, job.ras_at = status, now
        return True

    def _event(self, host: HostView, event: Event, now: float) -> None:
        """Apply one typed event; what the agent classified (Xid record, log line fields) is used as sent."""
        gpu = host.gpus[event.gpu] if event.gpu is not None and 0 <= event.gpu < len(host.gpus) else None
        match event:
            case XidOccurred():
                if gpu is not None:
                    apply_xid_in_burst(
                        gpu, event, self.judge_settings, self.dirty_gpus, storms=self.xid_storms, now=now
                    )
            case GpuStateChanged() | GpuWasReset():
                if gpu is not None:
                    apply_gpu_event(gpu, event, self.judge_settings, self.dirty_gpus)
            case LogLine(
                line_kind="nccl_warn_net" | "torch_watchdog_timeout" | "nccl_warn_cuda" as line_kind
            ):
                gpu_index = event.gpu
                if gpu_index is None and event.pid is not None:
                    gpu_index = _gpu_of_pid(host, event.pid)  # the agent did not know the pid's GPU yet
                host.events.append(
                    LogEvent(
                        t=event.t,
                        seen_at=now,
                        kind=line_kind,
                        gpu=gpu_index,
                        rank=event.rank,
                        seq=event.seq,
                        text=event.text[:512],
                    )
                )
            case LogLine(line_kind="other", sxid=int(sxid)):
                host.switches.note(event.pci_bus or "", sxid, event.severity, event.reason, event.t)
            case LogLine(line_kind="other", reason=reason) if host_evidence(event.text, reason):
                host.hcas.note(reason or "", event.text, event.t)
                # HCA lines no port record carries (the agent attaches the others to their port)
                host.events.append(
                    LogEvent(
                        t=event.t,
                        seen_at=now,
                        kind="kernel_ib",
                        gpu=event.gpu,
                        rank=None,
                        seq=None,
                        text=event.text[:512],
                    )
                )
            case _:
                pass  # other lines, FR dump notices, unavailable GPUs: kept by the agent's ring, not judged

    def _procs(self, host: HostView, procs: list[ProcInfo], now: float) -> None:
        old = {(p.job_id, p.rank) for p in host.procs if p.job_id is not None and p.rank is not None}
        host.procs = procs
        for gpu in host.gpus:
            gpu.job = gpu.rank = None
        new: set[tuple[str | None, int | None]] = set()
        for proc in procs:
            if proc.job_id is None or proc.rank is None:
                continue
            job = self._job(proc.job_id, now)
            view = self._rank(job, proc.rank) if job is not None else None
            if job is None or view is None:
                continue
            if not may_speak_for(view, host.name, self.hosts, by_process=True):
                self._claim_refused("rank_claimed", "rank_claim_refused", host.name, view, proc.job_id)
                waiting = self.waiting_claims
                if (proc.job_id, proc.rank) in waiting or len(waiting) < MAX_WAITING_CLAIMS:
                    waiting[(proc.job_id, proc.rank)] = host.name
                new.add((proc.job_id, proc.rank))  # still claimed: withdrawn only when a report drops it
                continue
            self.waiting_claims.pop((proc.job_id, proc.rank), None)
            if proc.world_size and 0 < proc.world_size <= self.max_ranks_per_job:
                if job.world_size != proc.world_size:
                    job.progress_version += 1
                job.world_size = proc.world_size
            if not view.alive:
                job.progress_version += 1
            view.host, view.gpu, view.pid, view.alive = host.name, proc.gpu, proc.pid, True
            if proc.debug is not None and (
                host.name in job.debug or len(job.debug) < MAX_DEBUG_HOSTS_PER_JOB
            ):
                job.debug[host.name] = proc.debug
            if 0 <= proc.gpu < len(host.gpus):
                gpu_view = host.gpus[proc.gpu]
                gpu_view.job = gpu_view.last_job = proc.job_id
                gpu_view.rank = gpu_view.last_rank = proc.rank
            new.add((proc.job_id, proc.rank))
        for job_id, rank in old - new:
            job_view = self.jobs.get(job_id or "")
            if job_view is None or rank is None or rank not in job_view.ranks:
                continue
            view = job_view.ranks[rank]
            if view.host != host.name:
                # a claim that was refused (another host runs the rank) and is withdrawn
                if self.waiting_claims.get((job_view.id, rank)) == host.name:
                    del self.waiting_claims[(job_view.id, rank)]
                continue
            if view.alive:
                job_view.progress_version += 1
            view.alive = False
            if (job_view.id, rank) in self.waiting_claims:
                self._hand_over(job_view.id, rank)

    def _hand_over(self, job_id: str, rank: int) -> None:
        """The rank's holder let go: the host whose claim was refused runs it, if its report still says so."""
        claimant = self.hosts.get(self.waiting_claims.pop((job_id, rank), ""))
        job = self.jobs.get(job_id)
        view = job.ranks.get(rank) if job is not None else None
        if claimant is None or job is None or view is None:
            return
        proc = next((p for p in claimant.procs if p.job_id == job_id and p.rank == rank), None)
        if proc is None:
            return
        view.host, view.gpu, view.pid, view.alive = claimant.name, proc.gpu, proc.pid, True
        job.progress_version += 1
        if 0 <= proc.gpu < len(claimant.gpus):
            gpu_view = claimant.gpus[proc.gpu]
            gpu_view.job = gpu_view.last_job = job_id
            gpu_view.rank = gpu_view.last_rank = rank

    def _claim_refused(self, reason: str, event: str, host: str, view: RankView, job_id: str) -> None:
        self.refusals.refused(
            reason,
            event,
            host=host,
            job=job_id[:256],
            rank=view.rank,
            holder=view.host,
            detail="the rank runs on its holder: another host may not speak for it",
        )

    def _job(self, job_id: str, now: float) -> JobView | None:
        job = self.jobs.get(job_id)
        if job is None:
            if len(self.jobs) >= self.max_jobs or len(job_id) > 256:
                self.ignored += 1
                return None
            job = self.jobs[job_id] = JobView(id=job_id, first_seen=now, last_progress_at=now)
        job.last_seen = now
        return job

    def silent_hosts(self, now: float, after_s: float) -> list[str]:
        """Disconnected hosts with no frame for ``after_s``, longest silent first."""
        silent = [h for h in self.hosts.values() if not h.connected and now - h.last_seen > after_s]
        return [h.name for h in sorted(silent, key=lambda h: h.last_seen)]

    def forget_host(self, name: str) -> None:
        """Drop everything about host ``name`` (it comes back as new if it ever connects again)."""
        self.xid_storms.forget_host(name)
        host = self.hosts.pop(name, None)
        self._hand_over_from(name)
        self.waiting_claims = {k: v for k, v in self.waiting_claims.items() if v != name}
        self.forgotten_hosts += 1
        self.changed_hosts.discard(name)  # the state store deletes its record (forgotten_hosts moved)
        self.window_changed.discard(name)
        if host is not None:
            self.dirty_gpus = [g for g in self.dirty_gpus if g.host != name]

    def end_job(self, job_id: str) -> None:
        """The job is over (no process, no heads for ``job_gone_after_s``): forget it."""
        self.jobs.pop(job_id, None)
        if self.waiting_claims:
            self.waiting_claims = {k: v for k, v in self.waiting_claims.items() if k[0] != job_id}

    def _rank(self, job: JobView, rank: int) -> RankView | None:
        if rank not in job.ranks and len(job.ranks) >= self.max_ranks_per_job:
            self.ignored += 1
            return None
        return job.rank_view(rank)

    def _heads(self, host: HostView, heads: FrHeads, now: float) -> None:
        job_id = heads.job_id
        if job_id is None:
            gpu = heads.gpu
            if gpu is not None and 0 <= gpu < len(host.gpus):
                job_id = host.gpus[gpu].job
            if job_id is None:
                return
        # (every rank's heads every 2 s: the lookups of a known job and rank are inlined)
        job = self.jobs.get(job_id)
        if job is None:
            job = self._job(job_id, now)
            if job is None:
                return
        else:
            job.last_seen = now
        view = job.ranks.get(heads.rank)
        if view is None:
            view = self._rank(job, heads.rank)
            if view is None:
                return
        name = host.name
        if view.host != name and not may_speak_for(view, name, self.hosts, by_process=False):
            self._claim_refused("rank_not_owned", "heads_refused", name, view, job_id)
            return
        world = heads.world_size
        if world and 0 < world <= self.max_ranks_per_job:
            if job.world_size != world:
                job.progress_version += 1
            job.world_size = world
        old = view.heads
        for pg in heads.pgs:
            if pg.ranks:
                heads = _share_group_ranks(job, heads)
                break
        view.heads, view.heads_at = heads, now
        if old is None:
            job.progress_version += 1
        else:
            # (a running job's first group completes another collective between two heads: that settles it
            # without the whole comparison)
            before, after = old.pgs, heads.pgs
            if (before and after and before[0].last_completed_seq != after[0].last_completed_seq) or not (
                same_progress(old, heads)
            ):
                job.progress_version += 1
        view.host = name
        if heads.gpu is not None:
            view.gpu = heads.gpu
        job.heads_version += 1
        log = job.heads_log
        log.append(view.rank)
        if len(log) > 2 * len(job.ranks) + HEADS_LOG_SLACK:
            del log[: len(log) // 2]
        progress = job.pg_progress
        for pg in heads.pgs:
            seq = pg.last_completed_seq
            known = progress.get(pg.pg_name)
            if known is None:
                progress[pg.pg_name] = (seq, now)
            elif seq > known[0]:
                progress[pg.pg_name] = (seq, now)
                job.last_progress_at = now
            base = job.step_base.get(pg.pg_name)
            if base is None or seq < base[0]:
                job.step_base[pg.pg_name] = (seq, now)
            elif now - base[1] >= STEP_BASELINE_S and seq > base[0]:
                # Heads arrive every ~2 s and a step may be ~1 s: a per-snapshot estimate jumps between one
                # and two steps per snapshot. Measuring over >= 10 s keeps the step time (and the straggler
                # floor derived from it) steady.
                step = (now - base[1]) / (seq - base[0])
                job.step_s = step if job.step_s is None else job.step_s + 0.3 * (step - job.step_s)
                job.step_base[pg.pg_name] = (seq, now)

    def take_dirty(self) -> list[GpuView]:
        dirty, self.dirty_gpus = self.dirty_gpus, []
        out: list[GpuView] = []
        changed = self.changed_hosts
        for gpu in dirty:
            if gpu.dirty:
                gpu.dirty = False
                out.append(gpu)
                changed.add(gpu.host)
        return out

    def gpu(self, host: str, index: int | None) -> GpuView | None:
        view = self.hosts.get(host)
        if view is None or index is None or not 0 <= index < len(view.gpus):
            return None
        return view.gpus[index]


MAX_GROUPS_PER_JOB = 4096


def same_progress(old: FrHeads, new: FrHeads) -> bool:
    """Whether ``new`` shows the same collective progress as ``old``: the same groups at the same enqueued,
    started and completed seqs with the same collectives in flight. Only the ages and stamps may differ: a
    stalled rank resends exactly this every 2 s, and re-examining a whole job's stall for it on every tick
    would cost the stuck detector in proportion to the job's ranks."""
    if old.world_size != new.world_size or len(old.pgs) != len(new.pgs):
        return False
    for a, b in zip(old.pgs, new.pgs, strict=True):
        if (
            a.last_enqueued_seq != b.last_enqueued_seq
            or a.last_completed_seq != b.last_completed_seq
            or a.last_started_seq != b.last_started_seq
            or a.pg_name != b.pg_name
            or a.pg_desc != b.pg_desc
            or len(a.in_flight) != len(b.in_flight)
            or (a.ranks is not b.ranks and a.ranks != b.ranks)
        ):
            return False
        for x, y in zip(a.in_flight, b.in_flight, strict=True):
            if (
                x.seq != y.seq
                or x.op != y.op
                or x.state != y.state
                or x.p2p != y.p2p
                or x.unconfirmed != y.unconfirmed  # confirmed: it may count as a wait now
            ):
                return False
    return True


def _share_group_ranks(job: JobView, heads: FrHeads) -> FrHeads:
    """``heads`` with each group's ranks list replaced by the job's copy of an equal list.

    Every rank of a group reports the same membership; kept verbatim per rank, a job of N ranks in groups of
    N would hold N² integers. Sharing
    keeps one list per group; a list that differs from the known one is kept as sent (and then replaces it).
    """
    if not any(pg.ranks for pg in heads.pgs):
        return heads
    known = job.pg_ranks
    pgs = []
    for pg in heads.pgs:
        ranks = pg.ranks
        kept = pg
        if ranks:
            shared = known.get(pg.pg_name)
            if shared is not None and shared is not ranks and shared == ranks:
                kept = msgspec.structs.replace(pg, ranks=shared)
            elif shared is None and len(known) < MAX_GROUPS_PER_JOB:
                known[pg.pg_name] = ranks
        pgs.append(kept)
    return msgspec.structs.replace(heads, pgs=pgs)


DROP_KINDS = ("samples", "events", "log_lines", "probe")
MAX_DROPS_PER_BATCH = 1 << 40  # a report beyond this is nonsense; counted as this much


def _add_drops(totals: dict[str, int], drops: Drops) -> None:
    for kind in DROP_KINDS:
        value = getattr(drops, kind)
        if value > 0:
            totals[kind] = totals.get(kind, 0) + min(value, MAX_DROPS_PER_BATCH)


def _gpu_of_pid(host: HostView, pid: int) -> int | None:
    for proc in host.procs:
        if proc.pid == pid:
            return proc.gpu
    return None

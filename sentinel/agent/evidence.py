"""Evidence before action: what the agent captures on its host when an incident names it.

For an :class:`~sentinel.wire.EvidenceRequest` the agent answers with the Python stacks of the job's rank
processes here, the kernel log around the fault and an ``nvidia-smi -q -x``-shaped snapshot of the GPUs.

Which processes are read is the agent's decision alone: only the pids its own job mapping (NVML's process
list of each GPU → environment/cgroup) holds as a rank of a job on one of this host's GPUs, mapped again
just before each read (the job mapper reads the live process: a pid reused since the last poll is another
process, with another start time, and is not read). A request names a job, GPUs or ranks, never a pid; a
named rank the agent does not know here is refused and counted. Each read has its own deadline and byte
limit, the whole answer a total deadline and byte budget, and one rank that cannot be read is an ``error``
on its entry, not a failed answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from sentinel.agent.kernel_window import KernelWindow
from sentinel.agent.stacks import StackReader
from sentinel.log import get_logger
from sentinel.wire import (
    EvidenceAnswer,
    EvidenceRequest,
    GpuInfo,
    GpuSample,
    GpuSnapshot,
    ProcInfo,
    RankStack,
)

log = get_logger(module="agent.evidence")

#: the most processes read per answer (a host runs one rank per GPU; a few per GPU at most)
MAX_PROCESSES = 64
#: a single process's stack output at most (py-spy JSON)
MAX_STACK_OUTPUT_BYTES = 1024 * 1024
#: share of the answer's bytes the kernel window may take; the rest is stacks and GPU snapshots
KERNEL_SHARE = 0.25
#: a simulated host's stacks (its ranks are the simulator's, not processes to read)
SIMULATED = "simulated host: its ranks are not processes"
#: time kept aside of the request's deadline for assembling and sending the answer
ANSWER_MARGIN_S = 0.5


@dataclass(frozen=True, slots=True)
class GpuReads:
    """What the agent last read of one GPU: identity, latest fast sample, latest slow one."""

    info: GpuInfo
    fast: GpuSample | None
    slow: GpuSample | None


def rank_processes(procs: list[ProcInfo], gpus: set[int], request: EvidenceRequest) -> list[ProcInfo]:
    """The processes the request's stacks are read from: mapped ranks of a job on this host's GPUs.

    A process counts only when the job mapping gives it a job and a rank and it sits on one of ``gpus``
    (this host's inventory); of those, the request's job's (or, without a job, those on its GPUs), narrowed
    to its ranks when it names some. One pid on several GPUs is read once.
    """
    wanted_gpus = set(request.gpus)
    wanted_ranks = set(request.ranks)
    out: list[ProcInfo] = []
    seen: set[int] = set()
    for proc in procs:
        if proc.job_id is None or proc.rank is None or proc.gpu not in gpus or proc.pid in seen:
            continue
        if request.job is not None and proc.job_id != request.job:
            continue
        if request.job is None and proc.gpu not in wanted_gpus:
            continue
        if wanted_ranks and proc.rank not in wanted_ranks:
            continue
        seen.add(proc.pid)
        out.append(proc)
    return sorted(out, key=lambda p: (p.rank if p.rank is not None else -1, p.pid))


class EvidenceCapture:
    """Answers ``evidence`` requests (blocking: run it off the event loop)."""

    def __init__(
        self,
        host: str,
        *,
        procs: Callable[[], list[ProcInfo]],
        gpus: Callable[[], dict[int, GpuReads]],
        kernel: KernelWindow,
        stacks: StackReader | None,
        problem: Callable[[str], None],
        remap: Callable[[ProcInfo], ProcInfo | None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.procs = procs
        self.gpus = gpus
        self.kernel = kernel
        #: None: a simulated host, whose ranks are not processes (nothing to read, nothing counted)
        self.stacks = stacks
        #: counts a refused rank or a stack not read, by reason (the agent's metric)
        self.problem = problem
        #: the process behind a mapped pid as the job mapper reads it now (a reused pid is another process,
        #: with another start time, and maps to its own job or none); None: the last mapping
        self.remap = remap
        self.clock = clock
        self.monotonic = monotonic

    def answer(self, request: EvidenceRequest) -> EvidenceAnswer:
        started = self.monotonic()
        deadline = started + max(0.0, request.timeout_s - ANSWER_MARGIN_S)
        now = self.clock()
        reads = self.gpus()
        answer = EvidenceAnswer(host=self.host, t=now)
        kernel_budget = int(request.max_bytes * KERNEL_SHARE)
        budget = request.max_bytes - kernel_budget

        chosen = rank_processes(self.procs(), set(reads), request)
        self._refuse_unknown(request, chosen, answer)
        if len(chosen) > MAX_PROCESSES:
            answer.cut.append(f"stacks of {len(chosen) - MAX_PROCESSES} processes past {MAX_PROCESSES}")
            chosen = chosen[:MAX_PROCESSES]

        wanted = set(request.gpus) or {p.gpu for p in chosen}
        for index in sorted(wanted):
            snap = self._gpu(index, reads.get(index))
            cost = len(snap.xml) + 64
            if cost > budget:
                answer.cut.append(f"GPU {index} snapshot: byte budget spent")
                continue
            budget -= cost
            answer.gpus.append(snap)

        fault = request.fault_t if request.fault_t is not None else now
        t0, t1 = fault - request.window_s, min(fault + request.window_s, now)
        answer.kernel, cut = self.kernel.between(t0, t1, kernel_budget)
        answer.kernel_window = (t0, t1)
        if cut:
            answer.cut.append(f"kernel lines older than the last {len(answer.kernel)} in the window")

        for index, proc in enumerate(chosen):
            left = deadline - self.monotonic()
            if left <= 0:
                answer.cut.append(f"stacks of {len(chosen) - index} processes: out of time")
                self.problem("deadline")
                break
            stack = self._stack(proc, min(left, request.timeout_s), min(budget, MAX_STACK_OUTPUT_BYTES))
            cost = len(msgspec.msgpack.encode(stack))
            if cost > budget:
                stack = RankStack(
                    pid=proc.pid, gpu=proc.gpu, job=proc.job_id, rank=proc.rank, error="byte budget spent"
                )
                cost = 128
            budget -= cost
            answer.stacks.append(stack)
        answer.took_s = round(self.monotonic() - started, 3)
        log.info(
            "evidence_captured",
            job=request.job,
            stacks=len(answer.stacks),
            failed=sum(1 for s in answer.stacks if s.error),
            refused=len(answer.refused),
            kernel_lines=len(answer.kernel),
            gpus=len(answer.gpus),
            took_s=answer.took_s,
        )
        return answer

    def _refuse_unknown(
        self, request: EvidenceRequest, chosen: list[ProcInfo], answer: EvidenceAnswer
    ) -> None:
        known = {p.rank for p in chosen}
        for rank in request.ranks:
            if rank not in known and len(answer.refused) < 1024:
                answer.refused[str(rank)] = "not a rank of a job on this host's GPUs"
                self.problem("not_a_local_rank")

    def _stack(self, proc: ProcInfo, timeout_s: float, max_bytes: int) -> RankStack:
        entry = RankStack(pid=proc.pid, gpu=proc.gpu, job=proc.job_id, rank=proc.rank)
        if self.stacks is None:
            entry.error = SIMULATED
            return entry
        # the mapping may be a poll old: read only a pid that is still that rank now
        if self.remap is not None:
            current = self.remap(proc)
        else:
            current = next((p for p in self.procs() if p.pid == proc.pid), None)
        if current is None or (current.job_id, current.rank) != (proc.job_id, proc.rank):
            entry.error = "no longer a rank of this job on this host"
            self.problem("gone")
            return entry
        began = self.monotonic()
        try:
            entry.threads, entry.error = self.stacks(proc.pid, timeout_s, max_bytes)
        except Exception as exc:  # one rank's read never fails the whole answer
            entry.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        entry.took_s = round(self.monotonic() - began, 3)
        if entry.error:
            self.problem("read_failed")
            log.warning("evidence_stack_failed", pid=proc.pid, rank=proc.rank, error=entry.error)
        return entry

    def _gpu(self, index: int, reads: GpuReads | None) -> GpuSnapshot:
        # here: XML (ElementTree, expat) is memory an agent would otherwise keep for the rare evidence capture
        from sentinel.agent.nvml.smi_snapshot import snapshot_xml

        if reads is None:
            return GpuSnapshot(gpu=index, error="no such GPU on this host")
        latest = reads.fast or reads.slow
        if latest is None:
            return GpuSnapshot(gpu=index, error="not read yet", xml=snapshot_xml(reads.info, None, None))
        stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(latest.t))
        return GpuSnapshot(
            gpu=index,
            xml=snapshot_xml(reads.info, reads.fast, reads.slow, timestamp=stamp),
            read_at=latest.t,
        )

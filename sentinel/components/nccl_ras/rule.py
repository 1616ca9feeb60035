"""What an NCCL RAS answer says about a stalled job, in words for the stuck verdict's evidence.

RAS knows which processes of the job stopped answering (INCOMPLETE for seconds, DEAD after 60 s), which
communicator ranks sent no data, and which ranks launched fewer collectives than their peers. A mismatch
in counts is normal for a moving job (RAS's own gather is slower than NCCL's collectives), so it is only
evidence next to a stall the heads already show, never a verdict of its own.
"""

from __future__ import annotations

from typing import Protocol

from sentinel.components.nccl_ras.record import RasProcess, RasRankRef, RasStatus

MAX_NAMED = 8


def _procs(procs: list[RasProcess]) -> str:
    text = "; ".join(
        f"process {p.pid} on node {p.node} GPU {','.join(str(g) for g in p.gpus)}" for p in procs[:MAX_NAMED]
    )
    return text + (f"; … ({len(procs)} in all)" if len(procs) > MAX_NAMED else "")


def _ranks(ranks: list[RasRankRef]) -> str:
    named = []
    for r in ranks[:MAX_NAMED]:
        where = f" (node {r.node} GPU {r.gpu})" if r.node and r.gpu is not None else ""
        named.append(f"{r.rank}{where}")
    return ", ".join(named) + (f", … ({len(ranks)} in all)" if len(ranks) > MAX_NAMED else "")


def ras_evidence(status: RasStatus | None, age_s: float, max_age_s: float) -> list[str]:
    """Evidence lines from a RAS answer at most ``max_age_s`` old (none when RAS reported no problem)."""
    if status is None or age_s > max_age_s or status.healthy:
        return []
    head = f"NCCL RAS ({age_s:.0f}s ago)"
    out: list[str] = []
    if status.dead_process_count:
        out.append(
            f"{head}: {status.dead_process_count} job process(es) dead: {_procs(status.dead_processes)}"
        )
    if status.missing_process_count:
        out.append(
            f"{head}: no data from {status.missing_process_count} job process(es): "
            f"{_procs(status.missing_processes)}"
        )
    for comm in status.comms[:4]:
        if comm.kind == "INCOMPLETE" and comm.missing:
            named = f": {_ranks(comm.missing_ranks)}" if comm.missing_ranks else ""
            out.append(f"{head}: communicator {comm.comm} ({comm.hash}) misses {comm.missing} rank(s){named}")
        elif comm.kind == "MISMATCH" and comm.groups:
            counted = [g for g in comm.groups if g.ops is not None]
            if len(counted) >= 2:
                low = min(counted, key=lambda g: g.ops or 0)
                high = max(counted, key=lambda g: g.ops or 0)
                named = f": {_ranks(low.ranks)}" if low.ranks else ""
                out.append(
                    f"{head}: communicator {comm.comm} {low.count} rank(s) behind at operation {low.ops} "
                    f"while {high.count} reached {high.ops} ({comm.about}){named}"
                )
        elif comm.kind == "ERROR" and comm.errors:
            out.append(f"{head}: communicator {comm.comm} NCCL errors on rank(s) {_ranks(comm.errors)}")
    if status.timeouts:
        out.append(f"{head}: {status.timeouts} RAS timeout(s) while gathering data")
    return out[:6]


class RasJob(Protocol):
    """What the stall evidence reads of a job: NCCL RAS's latest answer about it and when it arrived."""

    @property
    def ras(self) -> RasStatus | None: ...

    #: aggregator clock when the answer arrived
    @property
    def ras_at(self) -> float: ...


class StallSettings(Protocol):
    """The stuck detector's setting the evidence reads: how old an answer may be."""

    @property
    def net_error_window_s(self) -> float: ...


def stall_evidence(job: RasJob, settings: StallSettings, now: float) -> list[str]:
    """The evidence RAS's latest answer about a stalled job adds to its verdict."""
    return ras_evidence(job.ras, now - job.ras_at, settings.net_error_window_s)

"""Plain log lines for ``sentinel demo`` when stdout is not a terminal (CI logs, pipes, files).

:class:`Narrator` compares each view with the previous one and says what changed: a fault injected, a
verdict opened (with evidence, action, and the fault it caught and after how long), a verdict closed, a job
changing state; plus a one-line status every ``status_every_s``. Pure apart from the state it keeps between
calls.
"""

from __future__ import annotations

from sentinel.demo.model import CELL_STATES, ViewModel
from sentinel.demo.outcome import Fault, Verdict
from sentinel.demo.summary import format_delay


def _stamp(t_s: float) -> str:
    return f"[t+{t_s:6.1f}s]"


def _caught_by(vm: ViewModel, verdict: Verdict) -> Fault | None:
    for catch in vm.outcome.catches:
        if catch.verdict is not None and catch.verdict.id == verdict.id:
            return catch.fault
    return None


class Narrator:
    def __init__(self, status_every_s: float = 15.0) -> None:
        self._status_every_s = status_every_s
        self._next_status_s = 0.0
        self._faults_told: set[int] = set()
        self._verdicts_open: dict[str, str] = {}  # id -> state last told
        self._job_states: dict[str, str] = {}
        self._reachable = True

    def lines(self, vm: ViewModel) -> list[str]:
        """What changed since the last call, in time order (each line starts with its ``[t+...]`` stamp)."""
        t = vm.snap.t_s
        out: list[tuple[float, str]] = []
        if vm.snap.reachable != self._reachable:
            self._reachable = vm.snap.reachable
            state = "answering again" if vm.snap.reachable else "not answering"
            out.append((t, f"{_stamp(t)} aggregator {state}"))
        for fault in vm.info.faults:
            if fault.at_s <= t and fault.index not in self._faults_told:
                self._faults_told.add(fault.index)
                out.append(
                    (
                        fault.at_s,
                        f"{_stamp(fault.at_s)} fault injected: {fault.describe()} on {fault.where()}",
                    )
                )
        for verdict in vm.snap.verdicts:
            told = self._verdicts_open.get(verdict.id)
            if told is None:
                self._verdicts_open[verdict.id] = verdict.state
                out.append((verdict.opened_s, self._opened(vm, verdict)))
            elif told == "open" and verdict.state != "open":
                self._verdicts_open[verdict.id] = verdict.state
                out.append(
                    (t, f"{_stamp(t)} verdict {verdict.id} closed: {verdict.kind} on {verdict.where()}")
                )
        for job in vm.snap.jobs:
            if self._job_states.get(job.id) != job.state:
                before = self._job_states.get(job.id)
                self._job_states[job.id] = job.state
                change = f"{before} -> {job.state}" if before else job.state
                out.append((t, f"{_stamp(t)} job {job.id}: {change}"))
        if t >= self._next_status_s:
            self._next_status_s = t + self._status_every_s
            counts = vm.counts()
            parts = [f"{counts[s]} {s}" for s in CELL_STATES if counts[s]]
            jobs = ", ".join(f"{j.id} {j.state}" for j in vm.snap.jobs) or "none reported"
            out.append((t, f"{_stamp(t)} status: GPUs {', '.join(parts)}; jobs: {jobs}"))
        out.sort(key=lambda item: item[0])  # stable: same-time lines keep the order above
        return [line for _, line in out]

    @staticmethod
    def _opened(vm: ViewModel, verdict: Verdict) -> str:
        line = (
            f"{_stamp(verdict.opened_s)} verdict opened: {verdict.kind} on {verdict.where()}"
            f" reason={verdict.reason} action={verdict.action}"
        )
        fault = _caught_by(vm, verdict)
        if fault is not None:
            line += f" -- caught {fault.describe()} on {fault.where()} after {format_delay(max(0.0, verdict.opened_s - fault.at_s))}"
        elif any(v.id == verdict.id for v in vm.outcome.wrong):
            line += " -- no injected fault explains it"
        if verdict.evidence:
            line += " evidence: " + "; ".join(verdict.evidence)
        return line

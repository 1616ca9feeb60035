"""Evidence before action: an incident's hosts capture what only they can see, before any drain.

When a stall or a faulty GPU opens an incident, the hosts it names (the verdict's host first, then the
job's) are asked for an ``evidence`` answer: their ranks' Python stacks, the kernel log around the fault
and an ``nvidia-smi -q -x``-shaped snapshot of the GPUs (:mod:`sentinel.agent.evidence`). The answers are
attached to the incident. Until they are — or the deadline passed — :class:`EvidenceGate` holds every drain
of a host the incident names, so remediation never takes away the state the evidence is read from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from sentinel.aggregator.verdicts import Verdict
from sentinel.config.aggregator import IncidentsConfig
from sentinel.log import get_logger
from sentinel.wire import MAX_EVIDENCE_BYTES, Command, CommandResult, EvidenceAnswer, EvidenceRequest

Requester = Callable[[str, Command, float], Awaitable[CommandResult | None]]
EvidenceState = Literal["collecting", "done", "failed"]

#: evidence bytes kept per incident over all hosts
MAX_TOTAL_BYTES = 32 * 1024 * 1024
#: added to the agents' own deadline for the answer to travel
ANSWER_MARGIN_S = 2.0
#: incidents whose evidence is awaited at once at most (older ones stop holding drains)
MAX_PENDING = 1024


def log() -> Any:
    return get_logger(module="aggregator.evidence")


class EvidenceReport(msgspec.Struct, kw_only=True):
    """An incident's evidence: each host's answer as sent (stacks, kernel lines, GPU snapshots)."""

    state: EvidenceState
    requested_at: float | None = None
    finished_at: float | None = None
    fault_t: float | None = None
    hosts: dict[str, dict[str, Any]] = {}  # host → its EvidenceAnswer
    missing_hosts: list[str] = []
    problems: list[str] = []


def evidence_hosts(verdict: Verdict, job_hosts: list[str], max_hosts: int) -> list[str]:
    """The hosts asked: the verdict's own host (or the hosts of its domain) first, then the job's, at most
    ``max_hosts``."""
    hosts = [verdict.host] if verdict.host else []
    hosts += [h for h in verdict.hosts if h and h not in hosts]  # a domain verdict's hosts
    hosts += [h for h in job_hosts if h and h not in hosts]
    return hosts[:max_hosts]


def request_for(verdict: Verdict, host: str, config: IncidentsConfig, max_bytes: int) -> EvidenceRequest:
    """What ``host`` is asked for: the job's ranks there, and the verdict's GPU on the verdict's host."""
    gpus = [verdict.gpu] if host == verdict.host and verdict.gpu is not None and verdict.gpu >= 0 else []
    return EvidenceRequest(
        job=verdict.job,
        gpus=gpus,
        fault_t=verdict.evidence_t,
        window_s=config.evidence_window_s,
        timeout_s=config.evidence_timeout_s,
        max_bytes=max_bytes,
    )


async def gather(
    requester: Requester,
    incident_id: str,
    verdict: Verdict,
    hosts: list[str],
    config: IncidentsConfig,
    *,
    clock: Callable[[], float] = time.time,
    max_answer_bytes: int = MAX_EVIDENCE_BYTES,
) -> EvidenceReport:
    """Ask every host at once; each answer is kept as it arrives, a host past the deadline is missing.

    ``max_answer_bytes``: what one answer may hold so that it fits the stream's frame limit."""
    report = EvidenceReport(state="done", requested_at=clock(), fault_t=verdict.evidence_t)
    per_host = min(MAX_EVIDENCE_BYTES, max_answer_bytes, MAX_TOTAL_BYTES // max(1, len(hosts)))
    timeout = config.evidence_timeout_s + ANSWER_MARGIN_S

    async def ask(host: str) -> tuple[str, CommandResult | None]:
        command = Command(
            id=f"{incident_id}:evidence:{host}", request=request_for(verdict, host, config, per_host)
        )
        try:
            return host, await asyncio.wait_for(requester(host, command, timeout), timeout + 1.0)
        except (TimeoutError, ConnectionError):
            return host, None

    try:
        for next_answer in asyncio.as_completed([ask(h) for h in hosts]):
            host, result = await next_answer
            if result is None or not result.ok:
                report.missing_hosts.append(host)
                if result is not None:
                    report.problems.append(f"{host}: {result.error[:300]}")
                continue
            if not isinstance(result.answer, EvidenceAnswer):
                report.problems.append(f"{host}: answered with {type(result.answer).__name__}, not evidence")
                continue
            answer = result.answer
            if answer.host and answer.host != host:
                report.problems.append(f"{host}: answered for host {answer.host[:100]!r}; kept as {host}")
            report.hosts[host] = msgspec.to_builtins(msgspec.structs.replace(answer, host=host))
        report.missing_hosts.sort()
    finally:
        report.finished_at = clock()
    return report


@dataclass(slots=True)
class _Pending:
    hosts: frozenset[str]
    until: float
    done: asyncio.Event


class EvidenceGate:
    """Holds drains of an incident's hosts until its evidence is attached (or its deadline passed)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.pending: dict[str, _Pending] = {}  # incident id → its hosts, deadline, settled event

    def open(self, incident_id: str, hosts: list[str], wait_s: float) -> None:
        """Evidence for ``incident_id`` is being gathered from ``hosts`` for at most ``wait_s``."""
        now = self.clock()
        self.pending = {k: p for k, p in self.pending.items() if p.until > now and not p.done.is_set()}
        while len(self.pending) >= MAX_PENDING:
            self.pending.pop(next(iter(self.pending)))
        self.pending[incident_id] = _Pending(frozenset(hosts), now + wait_s, asyncio.Event())

    def settle(self, incident_id: str) -> None:
        """The incident's evidence is attached (or will not come): its drains may go ahead."""
        found = self.pending.pop(incident_id, None)
        if found is not None:
            found.done.set()

    def holding(self, verdict: Verdict) -> list[str]:
        """The incidents whose evidence a drain for ``verdict`` waits for now."""
        now = self.clock()
        return [
            k
            for k, p in self.pending.items()
            if p.until > now
            and not p.done.is_set()
            and (k == verdict.incident or (verdict.host is not None and verdict.host in p.hosts))
        ]

    async def wait(self, verdict: Verdict) -> None:
        """Return once no incident naming the verdict's host (or the verdict's own) still gathers evidence."""
        for incident_id in self.holding(verdict):
            found = self.pending.get(incident_id)
            if found is None:
                continue
            left = found.until - self.clock()
            if left <= 0:
                continue
            try:
                await asyncio.wait_for(found.done.wait(), left)
            except TimeoutError:
                log().warning("evidence_deadline_passed", incident=incident_id, verdict=verdict.id)

"""Open verdicts pushed back to the agent of the host they name, so ``sentinel health`` on that node knows them.

The agent judges its GPUs' hardware itself (the same rules), but stuck ranks, stragglers and anything else only
the fleet view sees are known here alone. Whenever a verdict on a host opens, changes or closes — and when the
host's agent (re)connects — the host is marked; after each detector tick every marked, connected host gets one
``verdicts`` command with the whole current set (idempotent: the agent replaces what it had).

A verdict resting on a yardstick learned from the fleet without a quorum of other hosts behind it
(``remediation.learned_quorum``) is not pushed: the host's health check would fail on it and Slurm would
drain the node, acting on what too few hosts taught.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

from sentinel.aggregator.remediation.policy import backed
from sentinel.aggregator.verdicts import Change, VerdictBook
from sentinel.config.aggregator import RemediationConfig
from sentinel.wire import Command, HostVerdict, VerdictsRequest

#: verdicts sent to one host at most (its GPUs' hardware verdicts plus a few job ones)
MAX_PER_HOST = 256


class VerdictPush:
    def __init__(
        self,
        book: VerdictBook,
        learned_quorum: Callable[[], int] = lambda: RemediationConfig().learned_quorum,
    ) -> None:
        self.book = book
        #: the quorum a fleet-learned verdict needs to be pushed (read at each push: a reload applies)
        self.learned_quorum = learned_quorum
        self.marked: set[str] = set()
        self._ids = itertools.count(1)

    def on_change(self, change: Change) -> None:
        if change.verdict.host:
            self.marked.add(change.verdict.host)

    def mark(self, host: str) -> None:
        self.marked.add(host)

    def command_for(self, host: str) -> Command:
        quorum = self.learned_quorum()
        verdicts = [
            HostVerdict(
                id=v.id, kind=v.kind, reason=v.reason, action=v.action, gpu=v.gpu, job=v.job, rank=v.rank
            )
            for v in self.book.open.values()
            if v.host == host and backed(v.learned_from, quorum)
        ]
        return Command(
            id=f"push-{next(self._ids)}", request=VerdictsRequest(verdicts=verdicts[:MAX_PER_HOST])
        )

    async def flush(self, send: Callable[[str, Command], Awaitable[bool]]) -> int:
        """Send every marked host its set; a host not connected now stays marked. Returns hosts sent."""
        sent = 0
        for host in sorted(self.marked):
            if await send(host, self.command_for(host)):
                self.marked.discard(host)
                sent += 1
        return sent

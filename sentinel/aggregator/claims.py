"""Which host may speak for a rank: the one that runs it, as its agent's process report says.

A rank is bound to the first host whose process table shows it (``ProcInfo``: pid → job/rank), or, known
only from flight-recorder heads, to the first host whose heads name it. Another host's process report,
heads or FR dump for that rank is refused — counted by reason in ``sentinel_ingest_rejected_total`` and
logged — while the holder still runs it: its process alive, the holder connected. A process report outranks
a binding made by heads alone, and a claim refused while the holder runs the rank takes the rank over when
the holder lets go (the rank's process ended, the holder disconnected), so a job requeued onto another node
is followed. So one agent cannot move a hang's blame, or a rank's progress, onto another host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class RankHolder(Protocol):
    """What of a rank's view the binding reads (:class:`~sentinel.aggregator.state.RankView`)."""

    @property
    def host(self) -> str | None: ...

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...


class Connected(Protocol):
    """What of a host's view the binding reads (:class:`~sentinel.aggregator.state.HostView`)."""

    @property
    def connected(self) -> bool: ...


#: refused claims remembered to hand the rank over later (beyond: the oldest is forgotten)
MAX_WAITING_CLAIMS = 4096


class RefusalSink(Protocol):
    """Where a refused claim is counted and logged (the server's :class:`~.refusals.RefusalLog`)."""

    def refused(self, reason: str, event: str, **fields: Any) -> bool: ...


class CountedRefusals:
    """The sink without a log (``sentinel sim``, an engine alone): refusals counted by reason."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def refused(self, reason: str, event: str, **fields: Any) -> bool:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        return False


def may_speak_for(
    view: RankHolder, claimant: str, hosts: Mapping[str, Connected], *, by_process: bool
) -> bool:
    """May ``claimant`` report (``by_process``: its process table) or send heads and dumps for this rank?"""
    holder = view.host
    if holder is None or holder == claimant or not view.alive:
        return True
    held = hosts.get(holder)
    if held is None or not held.connected:
        return True  # the holder is gone: its rank runs elsewhere now, if anywhere
    return by_process and view.pid is None  # a process report outranks a binding by heads alone


def dump_owners(ranks: Mapping[int, RankHolder]) -> dict[int, str]:
    """Rank → the host that runs it, for the FR dumps asked of a job's agents (ranks of unknown host left
    out: nobody's dump for them is refused)."""
    return {rank: view.host for rank, view in ranks.items() if view.host is not None}

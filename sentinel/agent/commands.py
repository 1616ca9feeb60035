"""The agent's command table: each request type the aggregator may send → its handler.

Requests are a tagged union (:data:`sentinel.wire.Request`) decoded and validated with the frame, so a
handler gets typed, bounded arguments or the frame is refused; it is never half-applied. Each handler gets
only what it acts on (:class:`CommandTargets`: the ring's snapshots, the FR dump control, the health
inbox), never the agent. Handlers that block (writing FR dump pipes, waiting for dump files) run off the
event loop. Adding a command is one request type in :mod:`sentinel.wire` plus its entry here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sentinel.wire import (
    Answer,
    Command,
    CommandResult,
    FrDumpAnswer,
    FrDumpRequest,
    HostVerdict,
    Request,
    Snapshot,
    SnapshotRequest,
    VerdictsRequest,
)


class Snapshots(Protocol):
    """The ring buffer's snapshot since a time (None: everything it holds)."""

    def __call__(self, since: float | None) -> Snapshot: ...


class FrDumpControl(Protocol):
    """Asking this host's ranks for their Flight Recorder dumps (:class:`sentinel.agent.fr_control.FrDumps`)."""

    def trigger_fr_dump(self, job: str | None = None) -> FrDumpAnswer: ...

    def fr_dump_collect(
        self, job: str | None, *, since: float, wait_s: float, max_bytes: int = ...
    ) -> FrDumpAnswer: ...


class VerdictInbox(Protocol):
    """Where the aggregator's verdicts on this host go (:class:`sentinel.agent.health.LocalHealth`)."""

    def push(self, verdicts: list[HostVerdict], now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class CommandTargets:
    """What the commands act on."""

    snapshot: Snapshots
    fr_dumps: FrDumpControl
    health: VerdictInbox
    clock: Callable[[], float]


async def _snapshot(targets: CommandTargets, request: SnapshotRequest) -> Answer:
    return targets.snapshot(request.since)


async def _fr_dump(targets: CommandTargets, request: FrDumpRequest) -> Answer:
    dumps = targets.fr_dumps
    if not request.collect:
        return await asyncio.to_thread(dumps.trigger_fr_dump, request.job)
    since = request.since if request.since is not None else targets.clock() - 60.0
    return await asyncio.to_thread(
        dumps.fr_dump_collect, request.job, since=since, wait_s=request.wait_s, max_bytes=request.max_bytes
    )


async def _verdicts(targets: CommandTargets, request: VerdictsRequest) -> Answer | None:
    targets.health.push(request.verdicts, targets.clock())
    return None


Handler = Callable[[CommandTargets, Any], Awaitable[Answer | None]]

COMMANDS: dict[type[Request], Handler] = {
    SnapshotRequest: _snapshot,
    FrDumpRequest: _fr_dump,
    VerdictsRequest: _verdicts,
}


async def dispatch(targets: CommandTargets, command: Command) -> CommandResult:
    """Run one command; a request without a handler is answered, never raised."""
    handler = COMMANDS.get(type(command.request))
    if handler is None:
        return CommandResult(
            id=command.id, ok=False, error=f"no handler for {type(command.request).__name__}"
        )
    answer = await handler(targets, command.request)
    return CommandResult(id=command.id, ok=True, answer=answer)

"""The agent's command table: each request type the aggregator may send → its handler.

Requests are a tagged union (:data:`sentinel.wire.Request`) decoded and validated with the frame, so a
handler gets typed, bounded arguments or the frame is refused; it is never half-applied. Handlers that block
(writing FR dump pipes, waiting for dump files) run off the event loop. Adding a command is one request type
in :mod:`sentinel.wire` plus its entry here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sentinel.wire import (
    Answer,
    Command,
    CommandResult,
    FrDumpRequest,
    Request,
    SnapshotRequest,
    VerdictsRequest,
)

if TYPE_CHECKING:
    from sentinel.agent.agent import Agent


async def _snapshot(agent: Agent, request: SnapshotRequest) -> Answer:
    return agent.snapshot(request.since)


async def _fr_dump(agent: Agent, request: FrDumpRequest) -> Answer:
    if not request.collect:
        return await asyncio.to_thread(agent.trigger_fr_dump, request.job)
    since = request.since if request.since is not None else agent.clock() - 60.0
    return await asyncio.to_thread(
        agent.fr_dump_collect, request.job, since=since, wait_s=request.wait_s, max_bytes=request.max_bytes
    )


async def _verdicts(agent: Agent, request: VerdictsRequest) -> Answer | None:
    agent.health.push(request.verdicts, agent.clock())
    return None


Handler = Callable[["Agent", Any], Awaitable[Answer | None]]

COMMANDS: dict[type[Request], Handler] = {
    SnapshotRequest: _snapshot,
    FrDumpRequest: _fr_dump,
    VerdictsRequest: _verdicts,
}


async def dispatch(agent: Agent, command: Command) -> CommandResult:
    """Run one command; a request without a handler is answered, never raised."""
    handler = COMMANDS.get(type(command.request))
    if handler is None:
        return CommandResult(
            id=command.id, ok=False, error=f"no handler for {type(command.request).__name__}"
        )
    answer = await handler(agent, command.request)
    return CommandResult(id=command.id, ok=True, answer=answer)

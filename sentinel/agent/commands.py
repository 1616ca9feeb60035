"""The agent's command table: each command name the aggregator may send → its typed arguments and handler.

A command's ``args`` are converted to the command's argument struct in one step (msgspec): a wrong type is
answered with ``ok=False`` and the validation error, never half-applied. Handlers that block (writing FR
dump pipes, waiting for dump files) run off the event loop. Adding a command is one entry here plus its
name in :class:`sentinel.wire.Command`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from sentinel.agent.frdump import MAX_COLLECT_BYTES
from sentinel.wire import Command, CommandResult, HostVerdict

if TYPE_CHECKING:
    from sentinel.agent.agent import Agent


class SnapshotArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """``snapshot``: the ring buffer from ``since`` (unix time; everything kept when absent)."""

    since: float | None = None


class FrDumpArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """``fr_dump``: trigger the job's local ranks to dump their flight recorder; with ``collect`` gather the
    dumps written since ``since`` (waiting up to ``wait_s``, at most ``max_bytes``)."""

    job: str | None = None
    collect: bool = False
    since: float | None = None
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 10.0
    max_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_COLLECT_BYTES)] = MAX_COLLECT_BYTES


async def _snapshot(agent: Agent, args: SnapshotArgs) -> Any:
    return agent.snapshot(args.since)


async def _fr_dump(agent: Agent, args: FrDumpArgs) -> Any:
    if not args.collect:
        return await asyncio.to_thread(agent.trigger_fr_dump, args.job)
    since = args.since if args.since is not None else agent.clock() - 60.0
    return await asyncio.to_thread(
        agent.fr_dump_collect, args.job, since=since, wait_s=args.wait_s, max_bytes=args.max_bytes
    )


class VerdictsArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """``verdicts``: every open verdict on this host (the whole set; it replaces the last one)."""

    verdicts: list[HostVerdict] = []


async def _verdicts(agent: Agent, args: VerdictsArgs) -> Any:
    agent.health.push(args.verdicts, agent.clock())
    return None


@dataclass(frozen=True)
class CommandSpec:
    args: type[msgspec.Struct]
    handler: Callable[[Agent, Any], Awaitable[Any]]


COMMANDS: dict[str, CommandSpec] = {
    "snapshot": CommandSpec(SnapshotArgs, _snapshot),
    "fr_dump": CommandSpec(FrDumpArgs, _fr_dump),
    "verdicts": CommandSpec(VerdictsArgs, _verdicts),
}


async def dispatch(agent: Agent, command: Command) -> CommandResult:
    """Run one command; unknown names and bad arguments are answered, never raised."""
    spec = COMMANDS.get(command.name)
    if spec is None:
        return CommandResult(id=command.id, ok=False, error=f"unknown command {command.name!r}")
    try:
        given: dict[str, Any] = dict(command.args)
        if command.verdicts:  # the one structured argument, carried in its own field of the frame
            given["verdicts"] = msgspec.to_builtins(command.verdicts)
        args = msgspec.convert(given, spec.args)
    except msgspec.ValidationError as exc:
        return CommandResult(id=command.id, ok=False, error=f"{command.name}: {exc}")
    payload = await spec.handler(agent, args)
    return CommandResult(id=command.id, ok=True, payload=payload)

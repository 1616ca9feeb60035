"""Slurm through its own commands: read node states (``sinfo``), drain and resume nodes, requeue jobs
(``scontrol``).

Shared by ``sentinel health --drain`` (a node drains itself, from Slurm's HealthCheckProgram) and the
aggregator's remediation. Every call is a subprocess with a deadline and a bounded output, run without a
shell (a reason is one argv element, never interpreted), and never raises for what Slurm answers: the
result says whether it worked and why not. Slurm's own state is the memory of what sentinel did — a node
drained by sentinel carries a reason starting ``sentinel:`` and Slurm records when it was set — so a
restarted aggregator, or a second one, counts the same drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass

#: what every reason sentinel sets starts with (and how its drains are recognised)
REASON_PREFIX = "sentinel:"
#: Slurm keeps reasons short; longer ones are cut (scontrol accepts more, sinfo columns do not)
MAX_REASON_CHARS = 200
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000
#: sinfo's long state names (%T) of a node that takes no new work, for whatever reason
UNAVAILABLE_STATES = frozenset({"down", "drained", "draining", "drain", "fail", "failing", "maint"})
#: field separator in our sinfo format: a control character no node name, state or user contains
_SEP = "\x1f"
SINFO_FORMAT = _SEP.join(("%N", "%T", "%u", "%H", "%E"))


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as ``sinfo -N`` shows it."""

    name: str
    state: str  # long state name, lower case, without the not-responding "*" etc.
    reason: str  # "" when none
    reason_user: str
    reason_time: float | None  # unix time the reason was set (Slurm's clock, its local time zone)
    not_responding: bool = False

    @property
    def unavailable(self) -> bool:
        return self.state in UNAVAILABLE_STATES

    @property
    def drained_by_sentinel(self) -> bool:
        return self.reason.startswith(REASON_PREFIX) and self.state in (
            "drained",
            "draining",
            "drain",
            "down",
        )


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job as ``scontrol show job -o`` shows it (the fields a requeue reads)."""

    id: str
    state: str  # JobState, upper case (RUNNING, PENDING, ...)
    batch: bool  # BatchFlag=1: only batch jobs can be requeued
    requeue: bool  # Requeue=1: the job allows it
    nodes: str  # NodeList, "" when none
    excluded: tuple[str, ...]  # ExcNodeList, as listed (names or ranges)
    restarts: int


def parse_job(text: str) -> SlurmJob | None:
    """The first job of ``scontrol show job -o ID`` output; None when it names none."""
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        job_id = fields.get("JobId", "")
        if not job_id.isdigit():
            continue
        excluded = fields.get("ExcNodeList", "")
        return SlurmJob(
            id=job_id,
            state=fields.get("JobState", "").upper(),
            batch=fields.get("BatchFlag", "0") == "1",
            requeue=fields.get("Requeue", "0") == "1",
            nodes="" if fields.get("NodeList", "") in ("", "(null)") else fields["NodeList"],
            excluded=() if excluded in ("", "(null)") else tuple(excluded.split(",")),
            restarts=int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0,
        )
    return None


def is_job_id(text: str) -> bool:
    """A Slurm job id sentinel may act on: digits only (array and het-job forms are left alone)."""
    return text.isdigit() and len(text) <= 20


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    ok: bool
    output: str  # stdout, or the reason it failed (stderr, timeout, not found)
    argv: tuple[str, ...]


def _reason_time(text: str) -> float | None:
    text = text.strip()
    if not text or text.lower() in ("unknown", "none", "n/a"):
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return when.timestamp() if 1970 < when.year < 3000 else None  # Slurm prints its local time
    return when.timestamp()


def parse_sinfo(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo -h -N -o SINFO_FORMAT`` output; malformed lines are skipped, duplicates merged.

    A node in several partitions is listed once per partition; the first line wins.
    """
    seen: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        parts = line.split(_SEP, 4)
        if len(parts) != 5:
            continue
        name, state, user, when, reason = (p.strip() for p in parts)
        if not name or len(name) > 255 or any(c.isspace() for c in name) or name in seen:
            continue
        raw_state = state.lower()
        flags = raw_state.rstrip("*~#!%$@^-")
        reason = "" if reason.lower() == "none" else reason
        seen[name] = SlurmNode(
            name=name,
            state=flags,
            reason=reason[:1024],
            reason_user=user[:64] if user.lower() not in ("unknown", "(null)") else "",
            reason_time=_reason_time(when) if reason else None,
            not_responding=raw_state.endswith("*"),
        )
        if len(seen) >= MAX_NODES:
            break
    return list(seen.values())


def drain_reason(text: str) -> str:
    """A reason sentinel sets: the prefix, the text on one line, cut to Slurm's comfortable size."""
    flat = " ".join(text.split())
    if not flat.startswith(REASON_PREFIX):
        flat = f"{REASON_PREFIX} {flat}"
    return flat[:MAX_REASON_CHARS]


async def run_command(
    argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None
) -> CommandOutcome:
    """Run ``argv`` (no shell) with a deadline; killed when it passes. Never raises for what the command does."""
    args = tuple(argv)
    if not args:
        return CommandOutcome(False, "empty command", args)
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env if env is not None else dict(os.environ),
        )
    except OSError as exc:
        return CommandOutcome(False, f"cannot run {args[0]}: {exc.strerror or exc}", args)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            await proc.wait()
        return CommandOutcome(False, f"{args[0]} did not finish within {timeout_s:g} s", args)
    stdout = out[:MAX_OUTPUT_BYTES].decode("utf-8", "replace")
    if proc.returncode != 0:
        detail = err[:2000].decode("utf-8", "replace").strip() or stdout.strip()[:2000]
        return CommandOutcome(False, f"{args[0]} exit {proc.returncode}: {detail}", args)
    return CommandOutcome(True, stdout, args)


class Slurm:
    """The Slurm commands of this machine (paths configurable, ``SLURM_CONF`` from the environment)."""

    def __init__(
        self,
        *,
        scontrol: str = "scontrol",
        sinfo: str = "sinfo",
        timeout_s: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.timeout_s = timeout_s
        self.env = env

    async def _run(self, argv: Sequence[str]) -> CommandOutcome:
        return await run_command(argv, self.timeout_s, self.env)

    async def nodes(self, partition: str = "") -> tuple[list[SlurmNode], str]:
        """Every node (of ``partition``), or ([], why not)."""
        argv = [self.sinfo, "-h", "-N", "-o", SINFO_FORMAT]
        if partition:
            argv += ["-p", partition]
        done = await self._run(argv)
        if not done.ok:
            return [], done.output
        return parse_sinfo(done.output), ""

    async def node(self, name: str) -> tuple[SlurmNode | None, str]:
        done = await self._run([self.sinfo, "-h", "-N", "-n", name, "-o", SINFO_FORMAT])
        if not done.ok:
            return None, done.output
        found = [n for n in parse_sinfo(done.output) if n.name == name]
        return (found[0], "") if found else (None, f"sinfo does not know node {name!r}")

    async def drain(self, name: str, reason: str) -> CommandOutcome:
        return await self._run(
            [self.scontrol, "update", f"nodename={name}", "state=drain", f"reason={drain_reason(reason)}"]
        )

    async def resume(self, name: str) -> CommandOutcome:
        return await self._run([self.scontrol, "update", f"nodename={name}", "state=resume"])

    async def job(self, job_id: str) -> tuple[SlurmJob | None, str]:
        """The job ``job_id`` as Slurm shows it, or (None, why not)."""
        if not is_job_id(job_id):
            return None, f"not a Slurm job id: {job_id[:64]!r}"
        done = await self._run([self.scontrol, "show", "job", "-o", job_id])
        if not done.ok:
            return None, done.output
        job = parse_job(done.output)
        return (job, "") if job is not None and job.id == job_id else (None, f"Slurm has no job {job_id}")

    async def requeue_excluding(self, job: SlurmJob, node: str) -> CommandOutcome:
        """Requeue a running batch job and add ``node`` to its excluded nodes (the ones it had are kept).

        Slurm changes ``ExcNodeList`` only of a pending job, so the requeue comes first; a requeued job waits
        for its begin time (the credential lifetime) before it can start again, and the update lands in that
        wait. The drained node takes no new work meanwhile either way.
        """
        done = await self._run([self.scontrol, "requeue", job.id])
        if not done.ok:
            return done
        excluded = ",".join(dict.fromkeys([*job.excluded, node]))
        return await self._run([self.scontrol, "update", f"JobId={job.id}", f"ExcNodeList={excluded}"])

    async def listpids(self, job_id: str = "") -> CommandOutcome:
        return await self._run([self.scontrol, "listpids", *([job_id] if job_id else [])])

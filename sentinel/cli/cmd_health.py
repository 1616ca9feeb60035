"""``sentinel health``: is this node fit for work? Asks the local agent (contract section 7).

For Slurm's HealthCheckProgram (``--drain``), a prolog or epilog (only the job's GPUs are judged; an epilog
also looks for processes still holding them), job launchers and monitoring systems (``--nagios``).
"Could not check" is never "fit": an agent that is down, not answering, or not yet collecting gives exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentinel.config import ConfigError, load_agent_config

DESCRIPTION = """Ask the local agent whether this node is fit: exit 0 fit, 1 unfit (one line per reason:
`GPU <index> <uuid>: <kind> <reason> -> <action>`), 2 cannot tell (agent not running or not answering).
In a Slurm prolog/epilog (SLURM_SCRIPT_CONTEXT, or --context) only the job's GPUs count (SLURM_JOB_GPUS, else
CUDA_VISIBLE_DEVICES); an epilog also reports processes still holding them (--kill ends them). --drain drains
this node through scontrol when it is unfit (for HealthCheckProgram). See docs/deploy.md (Slurm)."""

EXIT_FIT, EXIT_UNFIT, EXIT_UNKNOWN = 0, 1, 2
NAGIOS_OK, NAGIOS_WARNING, NAGIOS_CRITICAL, NAGIOS_UNKNOWN = 0, 1, 2, 3
MAX_ANSWER_BYTES = 4 * 1024 * 1024
KILL_WAIT_S = 5.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "health",
        help="is this node fit? ask the local agent (Slurm HealthCheckProgram, prolog/epilog, launchers)",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="agent TOML configuration (default /etc/sentinel/agent.toml if present, else built-in defaults)",
    )
    parser.add_argument("--url", help="agent base URL (default: the config's [metrics] address)")
    parser.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    parser.add_argument(
        "--nagios", action="store_true", help="one summary line; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN"
    )
    parser.add_argument(
        "--drain",
        action="store_true",
        help="when unfit, drain this Slurm node (SLURMD_NODENAME, else the agent's host) with a sentinel: reason",
    )
    parser.add_argument(
        "--context",
        choices=("auto", "node", "prolog", "epilog"),
        default="auto",
        help="what to judge: the whole node, or a job's GPUs (auto: from SLURM_SCRIPT_CONTEXT)",
    )
    parser.add_argument(
        "--kill", action="store_true", help="epilog: kill processes still holding the job's GPUs (SIGKILL)"
    )
    parser.add_argument("--scontrol", default="scontrol", help="scontrol command for --drain")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the agent (default 5)"
    )
    parser.set_defaults(func=_main)


@dataclass
class Answer:
    """What the command concluded: fit (True/False) or cannot tell (None, with why)."""

    fit: bool | None
    why_not: str = ""
    host: str = ""
    lines: list[str] = field(default_factory=list)  # one per unfit reason
    warnings: list[str] = field(default_factory=list)  # reasons that do not make the node unfit
    gpus: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was done (killed processes, drained)
    context: str = "node"


def agent_url(args: argparse.Namespace) -> tuple[str, str]:
    """(base URL, "") or ("", why there is none)."""
    if args.url:
        if not str(args.url).startswith(("http://", "https://")):
            return "", f"--url: not an http(s) URL: {args.url}"
        return str(args.url).rstrip("/"), ""
    try:
        config = load_agent_config(args.config)
    except ConfigError as exc:
        return "", str(exc)
    host = config.metrics.listen_host
    if not host:
        return "", "the agent's HTTP endpoint is disabled (metrics.listen_host is empty)"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.metrics.listen_port}", ""


def fetch(base: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    url = base + "/api/v1/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (scheme checked)
            body = response.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        return None, f"agent at {base} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"agent at {base} not reachable: {getattr(exc, 'reason', exc)}"
    try:
        doc = json.loads(body)
    except ValueError:
        return None, f"agent at {base} answered something that is not JSON"
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        return None, f"agent at {base} answered without a gpus list"
    return doc, ""


def job_gpus(env: dict[str, str]) -> tuple[set[str] | None, str]:
    """The job's GPUs as indices or UUIDs (SLURM_JOB_GPUS first, then CUDA_VISIBLE_DEVICES); None: unknown."""
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = env.get(name)
        if raw is not None and raw.strip() and raw.strip().lower() not in ("nodevfiles", "none"):
            items = {part.strip() for part in raw.split(",")[:1024] if part.strip()}
            if items:
                return items, name
    return None, ""


def _gpu_selected(gpu: dict[str, Any], wanted: set[str] | None) -> bool:
    if wanted is None:
        return True
    return str(gpu.get("index")) in wanted or str(gpu.get("uuid")) in wanted


def _line(reason: dict[str, Any], gpu: dict[str, Any] | None, host: str) -> str:
    where = f"GPU {gpu.get('index')} {gpu.get('uuid') or '-'}" if gpu is not None else f"host {host}"
    text = f"{where}: {reason.get('kind')} {reason.get('reason')} -> {reason.get('action')}"
    if reason.get("verdict"):
        text += f" (verdict {reason['verdict']})"
    return text


def _unfit(reason: dict[str, Any]) -> bool:
    from sentinel.agent.health import UNFIT_ACTIONS

    return reason.get("action") in UNFIT_ACTIONS or reason.get("kind") == "faulty"


def judge(doc: dict[str, Any], context: str, env: dict[str, str]) -> Answer:
    """The answer for ``context`` from the agent's health document (pure: no I/O)."""
    host = str(doc.get("host") or "")
    if doc.get("cannot_tell") or doc.get("fit") is None:
        return Answer(None, str(doc.get("cannot_tell") or "the agent cannot tell"), host, context=context)
    wanted: set[str] | None = None
    if context in ("prolog", "epilog"):
        wanted, _ = job_gpus(env)
    answer = Answer(True, host=host, context=context)
    for reason in doc.get("host_reasons") or []:
        (answer.lines if _unfit(reason) else answer.warnings).append(_line(reason, None, host))
    known = {str(g.get("index")) for g in doc["gpus"]} | {str(g.get("uuid")) for g in doc["gpus"]}
    if wanted is not None:
        missing = sorted(w for w in wanted if w not in known)
        if missing:  # a job GPU the agent does not watch cannot be vouched for
            return Answer(None, f"the job's GPUs {', '.join(missing)} are not known to the agent", host)
    for gpu in doc["gpus"]:
        if not isinstance(gpu, dict) or not _gpu_selected(gpu, wanted):
            continue
        answer.gpus.append(gpu)
        for reason in gpu.get("reasons") or []:
            (answer.lines if _unfit(reason) else answer.warnings).append(_line(reason, gpu, host))
    answer.fit = not answer.lines
    return answer


def leftover_processes(answer: Answer, job_id: str | None) -> list[tuple[dict[str, Any], int, str]]:
    """Epilog: (gpu, pid, name) of live processes on the job's GPUs that belong to it or to no known job."""
    import psutil

    from sentinel.agent.jobs import JobMapper

    by_gpu = {int(g["index"]): [int(p["pid"]) for p in g.get("processes") or []] for g in answer.gpus}
    gpus = {int(g["index"]): g for g in answer.gpus}
    mine = os.getpid()
    out = []
    for proc in JobMapper().map(by_gpu):
        if proc.pid == mine or not psutil.pid_exists(proc.pid):
            continue
        with contextlib.suppress(psutil.Error):
            if _zombie(psutil.Process(proc.pid)):
                continue
        if proc.job_id is None or job_id is None or proc.job_id == job_id:
            out.append((gpus[proc.gpu], proc.pid, proc.name or "?"))
    return out


def _kill(pids: list[int]) -> set[int]:
    """SIGKILL each pid; returns those still alive after KILL_WAIT_S."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.send_signal(signal.SIGKILL)
            procs.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=KILL_WAIT_S)
    return {p.pid for p in alive if not _zombie(p)}


def _zombie(proc: Any) -> bool:
    """A killed process not yet reaped by its parent holds nothing any more (its GPU context is gone)."""
    import psutil

    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def _epilog(answer: Answer, env: dict[str, str], kill: bool) -> None:
    job = env.get("SLURM_JOB_ID")
    left = leftover_processes(answer, job)
    if not left:
        return
    alive = _kill([pid for _, pid, _ in left]) if kill else {pid for _, pid, _ in left}
    for gpu, pid, name in left:
        where = f"GPU {gpu.get('index')} {gpu.get('uuid') or '-'}"
        if pid in alive:
            answer.lines.append(
                f"{where}: process {pid} ({name}) still holds the GPU after job {job or '?'} ended -> kill"
            )
        else:
            answer.notes.append(f"{where}: killed process {pid} ({name}) left by job {job or '?'}")
    answer.fit = not answer.lines


def _drain(answer: Answer, env: dict[str, str], scontrol: str) -> None:
    from sentinel.slurm import Slurm

    node = env.get("SLURMD_NODENAME") or answer.host
    if not node:
        answer.notes.append("not drained: no Slurm node name (SLURMD_NODENAME) and no agent host")
        return
    first = answer.lines[0] if answer.lines else "unfit"
    more = f" (+{len(answer.lines) - 1} more)" if len(answer.lines) > 1 else ""
    slurm = Slurm(scontrol=scontrol, timeout_s=15.0)
    known, _ = asyncio.run(slurm.node(node))
    if known is not None and known.unavailable:
        # idempotent: a node already drained (by sentinel, or by someone whose reason must stay) is left
        # as it is, and sentinel's drain keeps the time Slurm stamped on it (the breaker's window)
        answer.notes.append(f"Slurm node {node} already {known.state}: {known.reason or 'no reason'}")
        return
    done = asyncio.run(slurm.drain(node, f"sentinel: {first}{more}"))
    if done.ok:
        answer.notes.append(f"drained Slurm node {node}")
    else:
        answer.notes.append(f"could not drain Slurm node {node}: {done.output.strip()}")


def _main(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    context = args.context
    if context == "auto":
        script = env.get("SLURM_SCRIPT_CONTEXT", "")
        context = (
            "prolog" if script.startswith("prolog") else ("epilog" if script.startswith("epilog") else "node")
        )
    base, problem = agent_url(args)
    doc: dict[str, Any] | None = None
    if not problem:
        doc, problem = fetch(base, args.timeout)
    answer = Answer(None, problem, context=context) if doc is None else judge(doc, context, env)
    if answer.fit is not None and context == "epilog":
        _epilog(answer, env, args.kill)
    if answer.fit is False and args.drain:
        _drain(answer, env, args.scontrol)
    return _print(answer, args)


def _print(answer: Answer, args: argparse.Namespace) -> int:
    for note in answer.notes:
        print(note, file=sys.stderr)
    if args.json:
        sys.stdout.write(json.dumps(json_document(answer, time.time())) + "\n")
    if args.nagios:
        return _nagios(answer, quiet=args.json)
    if not args.json:
        if answer.fit is None:
            print(f"cannot tell: {answer.why_not}")
        elif answer.fit:
            print(f"fit: {answer.host or 'this node'}, {len(answer.gpus)} GPUs checked")
        else:
            for line in answer.lines:
                print(line)
    return EXIT_UNKNOWN if answer.fit is None else (EXIT_FIT if answer.fit else EXIT_UNFIT)


def json_document(answer: Answer, now: float) -> dict[str, Any]:
    """``--json``'s object (also ``agent once --nvml-replay``'s ``health``)."""
    return {
        "fit": answer.fit,
        "host": answer.host,
        "context": answer.context,
        "cannot_tell": answer.why_not or None,
        "reasons": answer.lines,
        "warnings": answer.warnings,
        "gpus": [
            {
                "index": g.get("index"),
                "uuid": g.get("uuid"),
                "state": g.get("state"),
                "reasons": g.get("reasons") or [],
            }
            for g in answer.gpus
        ],
        "actions": answer.notes,
        "t": now,
    }


def _nagios(answer: Answer, *, quiet: bool) -> int:
    if answer.fit is None:
        text, code = f"SENTINEL UNKNOWN - {answer.why_not}", NAGIOS_UNKNOWN
    elif not answer.fit:
        more = f" (+{len(answer.lines) - 1} more)" if len(answer.lines) > 1 else ""
        text, code = f"SENTINEL CRITICAL - {answer.lines[0]}{more}", NAGIOS_CRITICAL
    elif answer.warnings:
        more = f" (+{len(answer.warnings) - 1} more)" if len(answer.warnings) > 1 else ""
        text, code = f"SENTINEL WARNING - {answer.warnings[0]}{more}", NAGIOS_WARNING
    else:
        text, code = f"SENTINEL OK - {len(answer.gpus)} GPUs fit", NAGIOS_OK
    if not quiet:
        print(f"{text} | unfit={len(answer.lines)} warnings={len(answer.warnings)} gpus={len(answer.gpus)}")
    return code

"""Job-wide Flight Recorder dumps for stuck incidents: ask the job's agents, keep the files, analyze them.

When a job stalls, the heads say who the live detector blames; the full dumps say it with every rank's ring
buffer. The incident manager sends a ``FrDumpRequest(job, collect=True, since, wait_s, max_bytes)`` to every agent
of the job. Each agent writes its ranks' dump pipes, waits (bounded) for the dump files and answers with a
``FrDumpAnswer`` carrying them gzip-compressed (``dumps``). This module writes the dumps under one folder
per host (``<dir>/<host>/nccl_trace_rank_<rank>.gz``) and
runs the post-mortem analysis (:func:`sentinel.fr.dumpset.analyze_dir`: the no-globals unpickler in
memory-capped worker processes — the bytes came over the network and are never ``pickle.load``-ed).

Every size is bounded: the bytes per host are asked for within a fleet-wide budget, the answer's lists and
bytes are bounded by the frame's decoder, and a rank seen twice (two hosts claiming it) keeps its first dump.
A rank's dump is taken only from the host that runs it (the job's rank → host mapping when the dumps were
asked for, :mod:`~sentinel.aggregator.claims`): another host's dump for it is refused and reported, so one
agent cannot move a hang's blame onto another host's rank.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.errors import FrFormatError
from sentinel.fr.workers import Cancelled
from sentinel.wire import Answer, FrDumpAnswer

#: File name prefix of the stored dumps (the loader reads ``<prefix><rank>[.gz]``).
DUMP_PREFIX = "nccl_trace_rank_"
_GZIP_MAGIC = b"\x1f\x8b"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class FrDumpSettings:
    """How the incident manager collects job-wide dumps (``None`` in its place disables collection)."""

    wait_s: float = 8.0  # how long an agent waits for its ranks to write their dumps
    answer_margin_s: float = 7.0  # beyond wait_s, for reading, compressing and sending
    max_bytes_per_host: int = 6 * 1024 * 1024  # compressed dump bytes one agent may return (one frame)
    max_total_bytes: int = 128 * 1024 * 1024  # over every host: also bounds the memory of answers in flight
    clock_skew_s: float = 5.0  # dumps written this long before the stall began still count
    workers: int = 2  # decoding processes of the analysis


def per_host_budget(settings: FrDumpSettings, hosts: int) -> int:
    """Bytes each of ``hosts`` agents may return: the per-host bound within the fleet-wide budget."""
    share = settings.max_total_bytes // max(hosts, 1)
    floor = min(64 * 1024, settings.max_bytes_per_host)
    return max(floor, min(settings.max_bytes_per_host, share))


def settings_for_frame(max_frame_bytes: int, base: FrDumpSettings | None = None) -> FrDumpSettings:
    """``base`` with the per-host bound lowered so an agent's answer fits a frame of ``max_frame_bytes``
    (a larger answer would make the aggregator close that agent's stream with 1009)."""
    base = base or FrDumpSettings()
    fits = max(1024, max_frame_bytes * 3 // 4 - 4096)
    return replace(base, max_bytes_per_host=min(base.max_bytes_per_host, fits))


def host_dir_name(host: str) -> str:
    """A folder name for ``host`` that cannot leave the dump folder."""
    name = _UNSAFE.sub("_", host)[:200].lstrip(".")
    return name or "host"


def store_answer(
    root: Path,
    host: str,
    answer: Answer | None,
    seen: set[int],
    budget: int,
    *,
    owners: Mapping[int, str] | None = None,
) -> tuple[dict[str, Any], int]:
    """Write one agent's dumps under ``root/<host>/``; returns (the host's report, bytes written).

    ``seen`` holds the ranks already stored (updated here); ``budget`` is what may still be written. The
    answer arrived typed and bounded (the frame's decoder checked every field); the report keeps what the
    agent said about its pipes (triggered, missing, failed) and what it skipped, plus the ranks stored and
    the problems found: a rank another host already sent, a dump beyond the budget, a rank that ``owners``
    (rank → the host running it) says another host runs — those ranks also listed under ``refused``.
    """
    report: dict[str, Any] = {"dumps": [], "problems": []}
    if not isinstance(answer, FrDumpAnswer):
        report["problems"].append(f"{host}: answered fr_dump with {type(answer).__name__}, not dumps")
        return report, 0
    report["triggered"] = list(answer.triggered)
    report["missing"] = list(answer.missing)
    report["failed"] = dict(answer.failed)
    report["skipped"] = dict(answer.skipped)
    if answer.error:
        report["problems"].append(f"{host}: {answer.error[:200]}")
    folder = root / host_dir_name(host)
    written = 0
    for dump in answer.dumps:
        rank, data = dump.rank, dump.data
        if not data:
            report["problems"].append(f"{host}: rank {rank}'s dump is empty")
            continue
        owner = owners.get(rank) if owners is not None else None
        if owner is not None and owner != host:
            report["problems"].append(f"{host}: rank {rank} runs on {owner}, not here; its dump is refused")
            report.setdefault("refused", []).append(rank)
            continue
        if rank in seen:
            report["problems"].append(f"{host}: rank {rank} already has a dump from another host; ignored")
            continue
        if len(data) > budget - written:
            report["problems"].append(f"{host}: rank {rank}'s dump ({len(data)} bytes) exceeds the budget")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        suffix = ".gz" if data[:2] == _GZIP_MAGIC else ""
        (folder / f"{DUMP_PREFIX}{rank}{suffix}").write_bytes(data)
        written += len(data)
        seen.add(rank)
        report["dumps"].append(rank)
    return report, written


def why_no_dumps(hosts: dict[str, dict[str, Any]], missing_hosts: list[str]) -> str:
    """Why no agent returned a dump, in one bounded line: each distinct cause with the hosts it applies to.

    Users read this instead of the dumps, so it says what each agent said (its error or the problems in
    its answer, the ranks it triggered that wrote nothing in time, the ranks without a dump pipe) and which
    agents never answered, rather than one generic sentence for every cause.
    """
    causes: dict[str, list[str]] = {}
    for host, rep in sorted(hosts.items()):
        reasons = [str(p).removeprefix(f"{host}: ") for p in rep.get("problems", [])[:3]]
        if not reasons:
            triggered, missing = rep.get("triggered") or [], rep.get("missing") or []
            if triggered:
                reasons.append(f"{len(triggered)} ranks triggered, none wrote a dump in time")
            elif missing:
                reasons.append(f"no dump pipe for its {len(missing)} ranks")
            else:
                reasons.append("no local ranks to dump")
        for reason in reasons:
            causes.setdefault(reason, []).append(host)
    if missing_hosts:
        causes.setdefault("no answer", []).extend(sorted(missing_hosts))
    parts = []
    for reason, names in causes.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{reason} ({shown})")
    line = "no agent returned a flight-recorder dump" + (": " + "; ".join(parts) if parts else "")
    return line if len(line) <= 1000 else line[:999] + "…"


def analyze_dumps(root: Path, workers: int = 2, cancel: threading.Event | None = None) -> dict[str, Any]:
    """The contract's ``fr analyze --json`` object for the dumps under ``root``, or ``{"error": reason}``.

    Blocking (run it off the event loop). Decoding happens in bounded worker processes started with
    forkserver, which is safe in a threaded daemon; setting ``cancel`` (aggregator shutdown) kills them
    within 0.1 s. Never raises for what the dumps contain: every failure is the incident's reason.
    """
    try:
        result = analyze_dir(root, workers=max(1, workers), start_method="forkserver", cancel=cancel)
    except FrFormatError as exc:
        return {"error": str(exc)[:500]}
    except Cancelled:
        return {"error": "analysis cancelled (aggregator shutting down)"}
    except Exception as exc:  # a daemon never dies from what it observes
        return {"error": f"analysis failed: {type(exc).__name__}: {str(exc)[:300]}"}
    return result.to_json()

"""SYNTHETIC NCCL-format dumps, derived from the real gloo corpus.

Gloo records neither when a collective started nor when it completed; ProcessGroupNCCL does. These
dumps take a real gloo dump set and fill in what NCCL would have written, consistently with what gloo
recorded (documented fields of the flight recorder format, version 2.x):

* ``profiling_name`` ``nccl:<op>``; ``pg_config`` the true members (``{"name", "desc", "ranks": "[..]"}``);
* completed entries: ``state`` "completed", ``time_discovered_started_ns`` = created + launch delay,
  ``time_discovered_completed_ns`` = started + duration, ``duration_ms``;
* entries not completed: ``state`` "started" with a start time (the kernel launched and waits for its
  peers), or "scheduled" without one;
* ``pg_status`` ``last_started_collective`` following the entries.

A straggler's duration is short (its peers already wait), its peers' include the wait. :func:`poll_starts`
rewrites the times as PyTorch's watchdog stamps them with timing enabled. Nothing here was written by NCCL
itself; the docs say so.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

from sentinel.fr.loader import discover, load_dump

LAUNCH_NS = 40_000  # created -> started on the device
BASE_MS = 0.8  # a collective's device time when nobody waits
#: ProcessGroupNCCL's watchdog loop period (kWatchdogThreadSleepMillis), in ns.
WATCHDOG_POLL_NS = 100_000_000


def nccl_set(
    src: Path,
    dst: Path,
    truth: dict[str, Any] | None,
    *,
    started_pending: bool = True,
    stall_last: bool = False,
    members: dict[int, dict[str, tuple[str, list[int]]]] | None = None,
) -> Path:
    """Write an NCCL-format version of the gloo set in ``src`` under ``dst``; returns ``dst``.

    The true members (``pg_config``) come from the corpus ground truth ``truth``, or for a job's own set
    from ``members`` (:func:`members_from_meta`). ``stall_last``: the last collective of the world group
    becomes started on every rank and completed on none (a network/transport stall)."""
    dumps = {f.rank: load_dump(f.path) for f in discover(src)}
    if members is None:
        if truth is None:
            raise ValueError("nccl_set needs the members: a ground truth or members_from_meta")
        members = _members(truth)
    dst.mkdir(parents=True, exist_ok=True)
    # per (group, seq): the latest arrival over the members, to give each rank its wait as duration
    arrive: dict[tuple[str, int], int] = {}
    for d in dumps.values():
        for e in d.entries:
            key = (e["process_group"][0], e["collective_seq_id"])
            arrive[key] = max(arrive.get(key, 0), e["time_created_ns"])
    world_last = max(
        e["collective_seq_id"]
        for d in dumps.values()
        for e in d.entries
        if e["process_group"][1] == "default_pg"
    )
    for rank, d in dumps.items():
        entries = []
        status = copy.deepcopy(d.pg_status)
        for raw in d.entries:
            e = dict(raw)
            e["profiling_name"] = "nccl:" + e["profiling_name"].split(":", 1)[-1]
            name, seq = e["process_group"][0], e["collective_seq_id"]
            stalled = stall_last and e["process_group"][1] == "default_pg" and seq == world_last
            if e["retired"] and not stalled:
                wait_ns = max(0, arrive[(name, seq)] - e["time_created_ns"])
                mark_completed(e, BASE_MS + wait_ns / 1e6)
            else:
                mark_pending(e, started_at(e) if started_pending else None)
                if stalled:
                    st = status[str(e["pg_id"])]
                    st["last_completed_collective"] = min(st["last_completed_collective"], seq - 1)
            entries.append(e)
        for st in status.values():
            st["last_started_collective"] = st["last_enqueued_collective"] if started_pending else -1
        pg_config = {
            name: {"name": name, "desc": desc, "ranks": json.dumps(ranks)}
            for name, (desc, ranks) in members.get(rank, {}).items()
        }
        top = {"version": "2.10", "pg_config": pg_config, "pg_status": status, "entries": entries}
        (dst / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(top, protocol=2))
    return dst


def started_at(e: dict[str, Any]) -> int:
    """When the device started an entry's op: its host-side enqueue plus the launch delay."""
    return int(e["time_created_ns"]) + LAUNCH_NS


def mark_completed(e: dict[str, Any], duration_ms: float = BASE_MS) -> None:
    """NCCL's fields of a completed op: retired, started at :func:`started_at`, done ``duration_ms`` later."""
    started = started_at(e)
    e.update(
        retired=True,
        state="completed",
        time_discovered_started_ns=started,
        time_discovered_completed_ns=started + int(duration_ms * 1e6),
        duration_ms=duration_ms,
    )


def mark_pending(e: dict[str, Any], started: int | None) -> None:
    """NCCL's fields of an op not completed: started on the device at ``started``, or (None) merely
    scheduled."""
    e.update(
        retired=False,
        state="scheduled" if started is None else "started",
        time_discovered_started_ns=started,
        time_discovered_completed_ns=None,
        duration_ms=None,
    )


def _members(truth: dict[str, Any]) -> dict[int, dict[str, tuple[str, list[int]]]]:
    """rank -> {group name: (desc, member ranks)} from the corpus ground truth."""
    pgs = truth["process_groups"]
    out: dict[int, dict[str, tuple[str, list[int]]]] = {}
    for rank_s, names in pgs["per_rank_names"].items():
        rank = int(rank_s)
        table = out.setdefault(rank, {})
        for key, name in names.items():
            if key == "world":
                table[name] = ("default_pg", pgs["world"]["ranks"])
            else:
                group = next(g for g in pgs[key]["groups"] if rank in g)
                table[name] = (pgs[key]["desc"], group)
    return out


def members_from_meta(meta: Path) -> dict[int, dict[str, tuple[str, list[int]]]]:
    """rank -> {group name: (desc, member ranks)} from a job's ``meta/rank_<r>.json`` files (gloo_job and
    topo_job write each rank's groups there)."""
    out: dict[int, dict[str, tuple[str, list[int]]]] = {}
    for path in sorted(meta.glob("rank_*.json")):
        data = json.loads(path.read_text())
        out[int(data["rank"])] = {name: (g[0], list(g[1])) for name, g in data["groups"].items()}
    return out


def poll_starts(folder: Path, phase_ms: dict[int, float]) -> None:
    """Rewrite an :func:`nccl_set`'s completed entries as PyTorch records them with timing enabled: the
    watchdog, polling every :data:`WATCHDOG_POLL_NS` at each rank's own phase (``phase_ms``, 0 for a rank
    not named), finds start and completion together in the first pass after the device finished, and
    stamps both then (``FlightRecorder::update_state`` at ``retire_id``); ``duration_ms`` stays the
    device's own."""
    for path in folder.iterdir():
        rank = int(path.name.rsplit("_", 1)[1])
        top = pickle.loads(path.read_bytes())
        phase = int(phase_ms.get(rank, 0.0) * 1e6)
        for e in top["entries"]:
            if e["state"] == "completed":
                end = e["time_discovered_completed_ns"]
                found = ((end - phase) // WATCHDOG_POLL_NS + 1) * WATCHDOG_POLL_NS + phase
                e["time_discovered_started_ns"] = found
                e["time_discovered_completed_ns"] = found + 4_000  # two event queries later
        path.write_bytes(pickle.dumps(top, protocol=2))

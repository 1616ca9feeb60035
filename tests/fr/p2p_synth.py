"""SYNTHETIC NCCL-format dumps with point-to-point entries, derived from a real gloo job of tests.fr.topo_job.

Gloo (torch 2.13) does not record send/recv in the flight recorder; ProcessGroupNCCL does. The job
logged its own program order (``meta/ops_rank_<r>.json``: every collective and every send/recv, with its
peer, shape and whether it completed before the dump); this module merges that log with the real gloo
entries into what ProcessGroupNCCL would have written (documented fields of format 2.x):

* collectives: the gloo entry, ``profiling_name`` ``nccl:<op>``, ``state`` completed/started with
  start/completion times, ``op_id`` renumbered over collectives and p2p ops of the group;
* p2p ops: ``profiling_name`` ``nccl:send <me>-><peer>`` / ``nccl:recv <me><-<peer>`` with group-local
  ranks, ``is_p2p`` true, ``p2p_seq_id`` counting the group's p2p ops, ``collective_seq_id`` the
  group's last collective, input/output sizes the tensor shape;
* a ``batch_isend_irecv`` batch as ProcessGroupNCCL writes it (``ProcessGroupNCCL::pointToPoint`` and
  ``endCoalescing``, torch 2.5+, unchanged by the FlightRecorder refactor of 2.7): its ops share one
  ``p2p_seq_id`` and are recorded with no start/end events — no work of their own, so the watchdog never
  updates them: ``state`` scheduled, ``retired`` False, no times, forever — followed by one
  ``nccl:coalesced`` entry (same group and ``p2p_seq_id``, ``is_p2p`` true) that carries the batch's
  state, times and ``retired``; a lone op (``isend``/``irecv``) is a work of its own and carries its own.
  A batch of ONE op is a batch too (``batch_isend_irecv`` goes through ``_coalescing_manager`` whenever
  the backend supports coalescing): a member and a ``nccl:coalesced`` entry (mixed_hang_n4's ranks 1-3
  post one recv per batch). The ops log says which API posted each op (``coalesced``); a log without
  the field (older recordings) is read by the batch's size;
* ``pg_config`` the true members, ``pg_status`` counting collectives (NCCL's ``seqCollective_``).

Nothing here was written by NCCL itself; the docs say so.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from sentinel.fr.loader import discover, load_dump
from tests.fr.nccl_synth import mark_completed, mark_pending, started_at


def p2p_nccl_set(src: Path, dst: Path) -> Path:
    """Write the NCCL-format version of the topo_job set in ``src`` (its pickle/ and meta/) under ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in discover(src / "pickle"):
        d = load_dump(f.path)
        rank = f.rank
        meta = json.loads((src / "meta" / f"rank_{rank}.json").read_text())
        ops = json.loads((src / "meta" / f"ops_rank_{rank}.json").read_text())
        groups: dict[str, tuple[str, list[int]]] = {k: (v[0], v[1]) for k, v in meta["groups"].items()}
        colls = {(e["process_group"][0], e["collective_seq_id"]): e for e in d.entries}
        pg_ids = {e["process_group"][0]: e["pg_id"] for e in d.entries}
        entries: list[dict[str, Any]] = []
        op_id: dict[str, int] = {}
        p2p_seq: dict[str, int] = {}
        last_coll: dict[str, int] = {}
        i = 0
        while i < len(ops):
            rec = ops[i]
            group = rec["group"]
            if rec["kind"] == "coll":
                e = colls.get((group, rec["seq"]))
                i += 1
                if e is None:  # older than the ring buffer
                    continue
                e = dict(e)
                op_id[group] = op_id.get(group, 0) + 1
                last_coll[group] = rec["seq"]
                e["profiling_name"] = "nccl:" + e["profiling_name"].split(":", 1)[-1]
                e["op_id"] = op_id[group]
                _timing(e, bool(e["retired"]))
                entries.append(e)
                continue
            batch = [rec]
            while (
                i + len(batch) < len(ops)
                and ops[i + len(batch)]["kind"] != "coll"
                and ops[i + len(batch)].get("batch", -1) == rec.get("batch", -2)
            ):
                batch.append(ops[i + len(batch)])
            i += len(batch)
            p2p_seq[group] = p2p_seq.get(group, 0) + 1
            members = sorted(groups[group][1])
            me = members.index(rank)
            batch_done = all(op["done"] for op in batch)  # a coalesced batch completes as one work
            coalesced = bool(rec.get("coalesced", len(batch) > 1))
            for n, op in enumerate(batch):
                op_id[group] = op_id.get(group, 0) + 1
                peer = members.index(op["peer"])
                arrow = f"{me}->{peer}" if op["kind"] == "send" else f"{me}<-{peer}"
                shape = [op["shape"]]
                e = {
                    "record_id": 0,
                    "pg_id": pg_ids.get(group, 0),
                    "process_group": (group, groups[group][0]),
                    "collective_seq_id": last_coll.get(group, 0),
                    "p2p_seq_id": p2p_seq[group],
                    "op_id": op_id[group],
                    "profiling_name": f"nccl:{op['kind']} {arrow}",
                    "time_created_ns": op["t_ns"] + n,
                    "input_sizes": shape,
                    "output_sizes": shape,
                    "input_dtypes": ["Float"],
                    "output_dtypes": ["Float"],
                    "timeout_ms": 60000,
                    "is_p2p": True,
                }
                if coalesced:
                    _member(e)  # the batch's work is the nccl:coalesced entry below
                else:
                    _timing(e, batch_done)
                entries.append(e)
            if coalesced:
                e = dict(entries[-1])
                e.update(profiling_name="nccl:coalesced", input_sizes=[], output_sizes=[])
                e.update(input_dtypes=[], output_dtypes=[])
                _timing(e, batch_done)
                entries.append(e)
        for n, e in enumerate(entries):
            e["record_id"] = n
        status: dict[str, dict[str, int]] = {}
        for group, (_desc, _members) in groups.items():
            pg = str(pg_ids.get(group, 0))
            seqs = [
                e["collective_seq_id"]
                for e in entries
                if e["process_group"][0] == group and not e.get("is_p2p")
            ]
            done = [
                e["collective_seq_id"]
                for e in entries
                if e["process_group"][0] == group and not e.get("is_p2p") and e["retired"]
            ]
            status[pg] = {
                "last_enqueued_collective": max(seqs, default=0),
                "last_started_collective": max(seqs, default=0),
                "last_completed_collective": max(done, default=0),
            }
        pg_config = {n: {"name": n, "desc": desc, "ranks": json.dumps(m)} for n, (desc, m) in groups.items()}
        top = {"version": "2.10", "pg_config": pg_config, "pg_status": status, "entries": entries}
        (dst / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(top, protocol=2))
    return dst


def _member(e: dict[str, Any]) -> None:
    """An op of a coalesced batch as ProcessGroupNCCL::pointToPoint records it: with no start/end events
    (no work of its own), so the watchdog never updates it: scheduled, not retired, no times, forever."""
    mark_pending(e, None)


def _timing(e: dict[str, Any], done: bool) -> None:
    if done:
        mark_completed(e)
    else:
        mark_pending(e, started_at(e))


def closers_flagged(tops: dict[int, dict[str, Any]], flag: bool | None) -> dict[int, dict[str, Any]]:
    """The same dumps in an older layout of the batch's closing entry (in place; returns ``tops``).

    ``flag`` False: torch 2.5's ``ProcessGroupNCCL::initWork`` records the ``nccl:coalesced`` entry with
    ``isP2P = isP2POp(opType)``, and ``isP2POp(COALESCED)`` is false — the closer of a send/recv batch says
    ``is_p2p`` False, with its group's last ``collective_seq_id`` and the batch's ``p2p_seq_id`` (what
    this module already writes). ``flag`` None: no entry carries ``is_p2p`` at all (the key is dropped
    everywhere: what a reader must do when a dump predates or omits the field). SYNTHETIC: derived from the
    2.10-layout dumps above, nothing written by NCCL."""
    for top in tops.values():
        for e in top["entries"]:
            if flag is None:
                e.pop("is_p2p", None)
            elif e["profiling_name"] == "nccl:coalesced":
                e["is_p2p"] = flag
    return tops


def status_as_works(tops: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The same dumps with ``pg_status`` as ProcessGroupNCCL really keeps it (in place; returns ``tops``).

    Each value is the seq of the last enqueued / started / completed *work* of the group, of either counter
    (torch 2.5 ``initWork``: ``isP2P ? seqP2P_ : seqCollective_``; ``workEnqueue`` sets the enqueued value,
    the watchdog the started one when higher and the completed one per completed work, in list order). A
    collective is a work with its ``collective_seq_id``; a lone send/recv and a batch's ``nccl:coalesced``
    closer one with their ``p2p_seq_id``; a batch's members have no work. A pg_id that two groups share here
    (a group used only for send/recv got pg_id 0 above: gloo left no entry of it) keeps its status. SYNTHETIC: derived from the
    dumps above (whose status counts collectives only), nothing written by NCCL."""
    for top in tops.values():
        works: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        entries = top["entries"]
        for i, e in enumerate(entries):
            name = e["profiling_name"]
            member = name.startswith(("nccl:send", "nccl:recv")) and (
                i + 1 < len(entries)
                and entries[i + 1]["p2p_seq_id"] == e["p2p_seq_id"]
                and entries[i + 1]["process_group"] == e["process_group"]
                and entries[i + 1]["profiling_name"].startswith(("nccl:send", "nccl:recv", "nccl:coalesced"))
            )
            if member:
                continue
            p2p = name.startswith(("nccl:send", "nccl:recv", "nccl:coalesced"))
            works.setdefault(e["pg_id"], []).append((e["p2p_seq_id"] if p2p else e["collective_seq_id"], e))
        names: dict[int, set[str]] = {}
        for e in entries:
            names.setdefault(e["pg_id"], set()).add(e["process_group"][0])
        for pg_id, ws in works.items():
            if len(names[pg_id]) > 1:
                continue  # a group with send/recv only has no gloo entry to take its pg_id from: kept as is
            done = [seq for seq, e in ws if e["retired"]]
            started = [seq for seq, e in ws if e["state"] in {"started", "completed"}]
            top["pg_status"][str(pg_id)] = {
                "last_enqueued_collective": ws[-1][0],
                "last_started_collective": max(started, default=-1),
                "last_completed_collective": done[-1] if done else -1,
            }
    return tops

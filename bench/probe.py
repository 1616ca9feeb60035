"""CPU cost of one probe snapshot (dump + reduce + encode + send) in the training process.

    .venv/bin/python bench/probe.py            # synthetic 2,000-entry snapshot, and a real torch one if installed

    .venv/bin/python bench/probe.py --pipeline # only (c)

(a) synthetic: a JSON snapshot whose 2,000 entries are all in flight (the worst case: onlyActive returns
everything) fed to Probe.tick; (b) real: a 1-rank gloo process group with a 2,000-entry flight recorder,
the probe calling torch's own ``_dump_fr_trace_json(onlyActive=True)``. Thread CPU time per tick, and per
step-clock sample (the status-only dump the probe takes every 50 ms to time each step's compute).
(c) a running NCCL pipeline (synthetic, ProcessGroupNCCL's layout: tests/fr/test_live_policy.py): one rank
whose every 0.25 s step is an all_reduce and a ``batch_isend_irecv`` batch of one op, a 2,000-entry ring
buffer (every batch member in it stays in the active entries: ~670), pg_status mixing the two counters;
a minute of ticks on a virtual clock (2 s apart). It prints the dumps with entries per minute (active /
every entry) and the thread CPU per tick of Probe.snapshot (the fakes' own building excluded). Only the
Probe API of both policies is used, so the same file runs at an older commit for the before figure.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel.probe import SAMPLE_S, Probe, _torch_dump_fn
from tests.fr.synth import entry

TICKS = 200
PIPELINE_STEP_S = 0.25
PIPELINE_BUFFER = 2000
PIPELINE_TICKS = 30  # one minute at 2 s


def _ticks(probe: Probe, n: int, server: socket.socket) -> list[float]:
    out = []
    for _ in range(n):
        while True:  # drain like the agent does
            try:
                server.recv(1 << 17)
            except BlockingIOError:
                break
        start = time.thread_time()
        probe.tick()
        out.append((time.thread_time() - start) * 1e3)
    return out


def _report(name: str, ms: list[float], probe: Probe) -> None:
    ms.sort()
    print(
        f"{name:38s} median {statistics.median(ms):6.3f} ms  p90 {ms[int(0.9 * len(ms))]:6.3f} ms  "
        f"datagram {probe.stats.last_bytes} B  sent {probe.stats.sent} dropped {probe.stats.dropped}"
    )


class _Pipeline:
    """One rank of a running NCCL pipeline of one-op batches, as its recorder stands at ``at_ns``."""

    def __init__(self, horizon_s: float) -> None:
        self.ops: list[tuple[dict[str, Any], int | None, int]] = []  # (entry, completed at, work seq)
        t0 = 1_700_000_000_000_000_000
        self.t0 = t0
        for step in range(1, int(horizon_s / PIPELINE_STEP_S) + 2):
            t = t0 + int(step * PIPELINE_STEP_S * 1e9)
            for name, seq, p2p_seq, dt, done, work in (
                ("nccl:all_reduce", step, step - 1, 0, 5_000_000, step),
                ("nccl:send 0->1", step, step, 1_000_000, None, -1),
                ("nccl:coalesced", step, step, 1_001_000, 4_000_000, step),
            ):
                e = entry("0", seq, desc="default_pg", t_ms=0)
                e.update(
                    profiling_name=name,
                    p2p_seq_id=p2p_seq,
                    is_p2p=name != "nccl:all_reduce",
                    time_created_ns=t + dt,
                    input_sizes=[] if name == "nccl:coalesced" else [[1024]],
                    output_sizes=[] if name == "nccl:coalesced" else [[1024]],
                )
                self.ops.append((e, None if done is None else t + done, work))
        for n, (e, _, _) in enumerate(self.ops):
            e["record_id"] = e["op_id"] = n
        self.at_ns = t0

    def _top(self, only_active: bool) -> bytes:
        import pickle

        recorded = [op for op in self.ops if int(op[0]["time_created_ns"]) <= self.at_ns][-PIPELINE_BUFFER:]
        entries = []
        for e, done_ns, _ in recorded:
            done = done_ns is not None and done_ns <= self.at_ns
            if only_active and done:
                continue
            entries.append(
                {
                    **e,
                    "retired": done,
                    "state": "completed" if done else "scheduled",
                    "time_discovered_started_ns": int(e["time_created_ns"]) + 1000 if done else None,
                    "time_discovered_completed_ns": done_ns if done else None,
                    "duration_ms": 1.0 if done else None,
                }
            )
        top = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}}
        return pickle.dumps({**top, "pg_status": self._status(), "entries": entries}, protocol=2)

    def _status(self) -> dict[str, dict[str, int]]:
        works = [op for op in self.ops if op[2] >= 0 and int(op[0]["time_created_ns"]) <= self.at_ns]
        done = [op for op in works if op[1] is not None and op[1] <= self.at_ns]
        return {
            "0": {
                "last_enqueued_collective": works[-1][2] if works else -1,
                "last_started_collective": -1,
                "last_completed_collective": max(done, key=lambda op: op[1] or 0)[2] if done else -1,
            }
        }

    def status(self) -> bytes:
        import pickle

        return pickle.dumps({"pg_status": self._status()}, protocol=2)


def pipeline() -> None:
    """(c): dumps per minute and thread CPU per tick on a running pipeline of one-op batches.

    Every answer the fakes can give is built before the ticks (the same work at any commit), so the ticks
    are the probe's alone: ``PIPELINE_TICKS=0`` runs the set-up only, for callgrind's A/B (subtract it)."""
    ticks = int(os.environ.get("PIPELINE_TICKS", PIPELINE_TICKS))
    warm = PIPELINE_BUFFER / 3 * PIPELINE_STEP_S  # a full ring buffer from the first tick
    rec = _Pipeline(warm + 2.0 * (PIPELINE_TICKS + 1))
    times = [warm + 1.0 + 2.0 * i for i in range(PIPELINE_TICKS)]
    built = []
    for t in times:
        rec.at_ns = rec.t0 + int(t * 1e9)
        built.append((rec.status(), rec._top(True), rec._top(False)))
    answer = {"at": 0}
    calls = {"active": 0, "every": 0}

    def active() -> bytes:
        calls["active"] += 1
        return built[answer["at"]][1]

    def every() -> bytes:
        calls["every"] += 1
        return built[answer["at"]][2]

    probe = Probe(
        2.0, "/nonexistent/probe.sock", dump_fn=active, all_fn=every, status_fn=lambda: built[answer["at"]][0]
    )
    probe._identity = {"rank": 0, "local_rank": 0, "world_size": 2, "job_id": "bench", "pid": 1}
    ms = []
    for i, t in enumerate(times[:ticks]):
        answer["at"] = i
        start = time.thread_time()
        probe.snapshot(now=rec.t0 / 1e9 + t)
        ms.append((time.thread_time() - start) * 1e3)
    if not ms:
        return
    minutes = ticks * 2.0 / 60.0
    n_active = len(pickle_active(rec))
    mean = statistics.mean(ms)
    print(
        f"{'pipeline of one-op batches (mixed)':38s} median {statistics.median(ms):6.3f} ms  mean {mean:6.3f} ms"
        f"  p90 {sorted(ms)[int(0.9 * len(ms))]:6.3f} ms per tick  -> {mean / 2000:.2%} of a core;  dumps/min:"
        f" active {calls['active'] / minutes:.0f}, every entry {calls['every'] / minutes:.0f}"
        f"  ({n_active} active entries of {PIPELINE_BUFFER})"
    )


def pickle_active(rec: _Pipeline) -> list[object]:
    from sentinel.fr.safepickle import loads_plain

    obj = loads_plain(rec._top(True), source="bench")
    return list(obj["entries"]) if isinstance(obj, dict) else []


def main() -> int:
    if "--pipeline" in sys.argv[1:]:
        pipeline()
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="probebench-"))
    path = str(tmp / "probe.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    active = [entry("0", s, desc="default_pg", done=False, t_ms=s) for s in range(1, 2001)]
    status = {
        "0": {
            "last_enqueued_collective": "2000",
            "last_started_collective": "-1",
            "last_completed_collective": "0",
        }
    }
    raw = json.dumps({"version": "2.10", "entries": active, "pg_status": status}).encode()
    probe = Probe(2.0, path, dump_fn=lambda: raw)
    _report("synthetic, 2000 entries all in flight", _ticks(probe, TICKS, server), probe)
    idle = json.dumps({"version": "2.10", "entries": [], "pg_status": status}).encode()
    probe = Probe(2.0, path, dump_fn=lambda: idle)
    _report("synthetic, nothing in flight", _ticks(probe, TICKS, server), probe)
    pipeline()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("torch not installed: real snapshot skipped")
        return 0
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", TORCH_FR_BUFFER_SIZE="2000")
    store = dist.HashStore()  # type: ignore[attr-defined]  # torch exports it untyped (torch._C)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    t = torch.ones(16)
    for _ in range(2100):
        dist.all_reduce(t)
    probe = Probe(2.0, path)
    _report("real torch gloo FR, 2000 entries (steady)", _ticks(probe, TICKS, server), probe)
    samples = []
    for _ in range(2000):
        start = time.thread_time()
        probe.sample()
        samples.append((time.thread_time() - start) * 1e3)
    samples.sort()
    per_s = statistics.median(samples) / SAMPLE_S / 1e3
    print(
        f"{'real torch gloo FR, one step sample':38s} median {statistics.median(samples):6.3f} ms  "
        f"p90 {samples[int(0.9 * len(samples))]:6.3f} ms  -> {per_s:.2%} of one core at one per {SAMPLE_S * 1e3:.0f} ms"
    )
    full = Probe(2.0, path, dump_fn=_torch_dump_fn())
    _report("real torch gloo FR, 2000 entries (full)", _ticks(full, 30, server), full)
    print(
        "  (first tick takes one full dump to learn group names; later full dumps only when a wait persists)"
    )
    dist.destroy_process_group()
    server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

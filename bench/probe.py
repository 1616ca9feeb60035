"""CPU cost of one probe snapshot (dump + reduce + encode + send) in the training process.

    .venv/bin/python bench/probe.py            # synthetic 2,000-entry snapshot, and a real torch one if installed

(a) synthetic: a JSON snapshot whose 2,000 entries are all in flight (the worst case: onlyActive returns
everything) fed to Probe.tick; (b) real: a 1-rank gloo process group with a 2,000-entry flight recorder,
the probe calling torch's own ``_dump_fr_trace_json(onlyActive=True)``. Thread CPU time per tick, and per
step-clock sample (the status-only dump the probe takes every 50 ms to time each step's compute).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel.probe import SAMPLE_S, Probe, _torch_dump_fn
from tests.fr.synth import entry

TICKS = 200


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


def main() -> int:
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
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("torch not installed: real snapshot skipped")
        return 0
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", TORCH_FR_BUFFER_SIZE="2000")
    store = dist.HashStore()
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

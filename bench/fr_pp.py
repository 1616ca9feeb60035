"""Benchmark ``sentinel fr analyze`` on a healthy pipeline-parallel NCCL-format set, before/after a change.

Every step of a pipeline-parallel NCCL job sends and receives, so every dump counts send/recv before its
newest entries, which the newest-entries decode must answer for (docs/flight-recorder.md, "Speed"). The
set is SYNTHETIC, built from the real full-buffer gloo set ``bench/fr.py`` uses (``tests/data/fr/
wrapped_hang_n8``: torch 2.13, 2,000-entry ring buffers with their stack frames): every entry completed
with NCCL's timing fields (as ``tests/fr/nccl_synth.py`` fills them), ``nccl:`` names, and after every
``--every`` entries (at the next world-group entry) a completed send to / recv from the rank's pipeline neighbour (even ranks send to the
next rank, odd ranks receive from the previous one, in the world group: group-local ranks, ``p2p_seq_id``
counted, ``is_p2p``), with that entry's frames; ``pg_status`` done. With ``--batched`` each send/recv
goes through ``batch_isend_irecv`` as ProcessGroupNCCL writes it (as ``tests/fr/p2p_synth.py`` lays it
out; torch's pipelining schedules post their ops so): the op is a batch member, ``scheduled``, not
retired, no times, forever, and a completed ``nccl:coalesced`` entry (same group and ``p2p_seq_id``)
closes the batch. Then ``bench/fr.py``'s ``build_set`` replicates it to R ranks in PyTorch's pickle
layout. Nothing here was written by NCCL.

Each checkout given with ``--tree`` (default: this one) analyzes the same set as a command-line process
(its own ``sentinel`` package, this interpreter), interleaved, best of ``--repeat``:

    flock /tmp/sentinel-bench.lock .venv/bin/python bench/fr_pp.py --sets 4096x2000 --tree /work/main .
    flock /tmp/sentinel-bench.lock .venv/bin/python bench/fr_pp.py --batched --sets 4096x2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.fr import DEFAULT_SOURCE, _load_source, build_set  # noqa: E402
from tests.fr.nccl_synth import mark_completed, mark_pending  # noqa: E402


def pipeline_source(
    source: dict[int, dict[str, Any]], every: int, *, batched: bool = False
) -> dict[int, dict[str, Any]]:
    """The healthy NCCL-format pipeline version of each template rank (see the module docstring)."""
    out = {}
    world = len(source)
    for rank, dump in source.items():
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        entries: list[dict[str, Any]] = []
        p2p = since = 0
        for raw in dump["entries"]:
            e = _completed(dict(raw))
            e["profiling_name"] = "nccl:" + e["profiling_name"].split(":", 1)[-1]
            world_group = e["process_group"][1] == "default_pg"
            e["p2p_seq_id"] = p2p if world_group else 0
            entries.append(e)
            since += 1
            if since >= every and peer < world and world_group:
                p2p += 1
                since = 0
                arrow = f"{rank}->{peer}" if rank % 2 == 0 else f"{rank}<-{peer}"
                op = "send" if rank % 2 == 0 else "recv"
                s = dict(e, profiling_name=f"nccl:{op} {arrow}", is_p2p=True, p2p_seq_id=p2p)
                s.update(
                    input_sizes=[[1024]], output_sizes=[[1024]], time_created_ns=e["time_created_ns"] + 1
                )
                if not batched:
                    entries.append(_completed(s))
                    continue
                # each entry its own lists (frames: of the shared frame dicts), as PyTorch's dump builds
                # them: a list shared with the entry before would be memoized there
                s.update(frames=list(e.get("frames", [])), input_dtypes=["Float"], output_dtypes=["Float"])
                mark_pending(s, None)  # a batch member: no work of its own (tests/fr/p2p_synth.py)
                closer = dict(s, profiling_name="nccl:coalesced", input_sizes=[], output_sizes=[])
                closer.update(input_dtypes=[], output_dtypes=[], time_created_ns=s["time_created_ns"] + 1)
                closer["frames"] = list(s["frames"])
                entries += [s, _completed(closer)]
        for n, e in enumerate(entries):
            e["record_id"] = n
        status = {
            pg: dict(st, last_completed_collective=st["last_enqueued_collective"])
            for pg, st in dump["pg_status"].items()
        }
        out[rank] = dict(dump, entries=entries[-len(dump["entries"]) :], pg_status=status)
    return out


def _completed(e: dict[str, Any]) -> dict[str, Any]:
    mark_completed(e)
    return e


def run(tree: Path, folder: Path) -> tuple[float, str]:
    """Wall seconds and the verdict of ``tree``'s ``sentinel fr analyze`` on ``folder``."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder), "--json"],
        cwd=tree,
        capture_output=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    wall = time.perf_counter() - start
    try:
        verdict = json.loads(proc.stdout)["verdict"]
    except (ValueError, KeyError):
        verdict = f"rc={proc.returncode} {proc.stderr[-200:]!r}"
    return wall, verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", default=["4096x2000"], help="RANKSxENTRIES per set")
    ap.add_argument("--every", type=int, default=16, help="a send/recv after every this many entries")
    ap.add_argument("--batched", action="store_true", help="each send/recv a batch_isend_irecv batch")
    ap.add_argument("--tree", nargs="+", type=Path, default=[REPO], help="checkouts to compare")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved runs per checkout; the best counts")
    args = ap.parse_args()
    for tree in args.tree:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "sentinel")], check=True)
    source = pipeline_source(_load_source(DEFAULT_SOURCE), args.every, batched=args.batched)
    root = Path(tempfile.mkdtemp(prefix="frbench-pp-"))
    try:
        for spec in args.sets:
            ranks, entries = (int(x) for x in spec.split("x"))
            ranks -= ranks % len(source)
            folder = root / spec
            t = time.perf_counter()
            build_set(source, ranks, entries, folder)
            size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            print(f"built {folder} ({size:.0f} MiB) in {time.perf_counter() - t:.1f} s", flush=True)
            best: dict[Path, tuple[float, str]] = {}
            for _ in range(args.repeat):
                for tree in args.tree:
                    wall, verdict = run(tree, folder)
                    if tree not in best or wall < best[tree][0]:
                        best[tree] = (wall, verdict)
            load = os.getloadavg()[0]
            for tree, (wall, verdict) in best.items():
                print(f"{spec:>12} {tree!s:>24} {wall:8.2f} s  {verdict}  (load {load:.1f}, shared machine)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark ``sentinel fr analyze`` against PyTorch's ``torchfrtrace`` on large replicated dump sets.

Builds sets of R ranks x E entries by replicating a corpus dump set (8 ranks, pg_config repaired so
torchfrtrace can run): replica k holds ranks 8k..8k+7, its sub-group names are rewritten to unique ones
(the world group stays shared), and each rank's ring buffer is extended to E entries by repeating its
completed history with shifted sequence numbers and times (the stalled tail stays last). Entries get their
own lists, as PyTorch's pickler writes them. Then both tools run on the same set in this same run, as
subprocesses, measuring wall time and peak RSS (of the largest process, and of the whole process tree
sampled every 20 ms).

    .venv/bin/python bench/fr.py                       # 512 and 4,096 ranks x 2,000 entries
    .venv/bin/python bench/fr.py --sets 64x500 --skip-reference   # quick run
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sentinel.fr.safepickle import loads_plain  # noqa: E402

DEFAULT_SOURCE = REPO.parent / "shared/corpus/flight_recorder/hang_cascade_n8/pickle_pgfix"
PREFIX = "comm_lib_trace_rank_"


def _load_source(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(PREFIX):
            out[int(path.name[len(PREFIX) :])] = loads_plain(path.read_bytes(), source=str(path))
    return out


def _extend_status(dump: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """pg_status moved on as far as the extended entries (pg_id → the group's newest seqs)."""
    newest: dict[int, int] = {}
    for e in entries:
        newest[e["pg_id"]] = max(newest.get(e["pg_id"], -1), e["collective_seq_id"])
    status = {}
    for pg_id, st in dump.get("pg_status", {}).items():
        shift = newest.get(int(pg_id), st["last_enqueued_collective"]) - st["last_enqueued_collective"]
        status[pg_id] = {k: (v + shift if v >= 0 else v) for k, v in st.items()}
    return status


def _extend(entries: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Repeat the completed history (shifted seqs and times) until n entries; the stalled tail stays last."""
    done = [e for e in entries if e["retired"]]
    tail = [e for e in entries if not e["retired"]]
    per_pg: dict[str, int] = {}
    for e in done:
        per_pg[e["process_group"][0]] = max(per_pg.get(e["process_group"][0], 0), e["collective_seq_id"])
    span = done[-1]["time_created_ns"] - done[0]["time_created_ns"] + 1_000_000
    cycles = max(1, -(-(n - len(tail)) // len(done)))  # whole cycles keep every group's seqs contiguous
    out = [_shift(e, per_pg, c, span) for c in range(cycles) for e in done]
    out.extend(_shift(e, per_pg, cycles - 1, span) for e in tail)
    for i, e in enumerate(out):
        e["record_id"] = i
    return out


def _shift(e: dict[str, Any], per_pg: dict[str, int], cycle: int, span: int) -> dict[str, Any]:
    c = dict(e)
    c["collective_seq_id"] = e["collective_seq_id"] + cycle * per_pg.get(e["process_group"][0], 0)
    c["time_created_ns"] = e["time_created_ns"] + cycle * span
    for key in ("input_sizes", "output_sizes"):
        c[key] = [list(s) for s in e[key]]
    for key in ("input_dtypes", "output_dtypes"):
        c[key] = list(e[key])
    if "frames" in e:
        c["frames"] = list(e["frames"])
    return c


def build_set(source: dict[int, dict[str, Any]], ranks: int, entries: int, out: Path) -> None:
    """Write ranks dumps of ~entries entries each under out."""
    base = len(source)
    out.mkdir(parents=True, exist_ok=True)
    templates = {r: _extend(d["entries"], entries) for r, d in source.items()}
    statuses = {r: _extend_status(d, templates[r]) for r, d in source.items()}
    names = sorted({e["process_group"][0] for d in source.values() for e in d["entries"]}, key=int)
    world = names[0]
    for ents in templates.values():  # the world group's all_gathers gather from every rank of the set
        for e in ents:
            if e["process_group"][0] == world and "gather" in e["profiling_name"]:
                e["output_sizes"] = [[ranks, *s[1:]] for s in e["output_sizes"]]
    for k in range(ranks // base):
        rename = {n: (n if n == world else str(int(n) + k * 1000)) for n in names}
        for r, d in source.items():
            ents = templates[r]
            for e in ents:
                name, desc = e["process_group"]
                e["process_group"] = (rename.get(name, name), desc)
            pg_config = {}
            for name, cfg in d["pg_config"].items():
                members = [int(x) for x in cfg["ranks"].strip("[]").split(",") if x.strip()]
                members = list(range(ranks)) if name == world else [m + k * base for m in members]
                pg_config[rename[name]] = {"name": rename[name], "desc": cfg["desc"], "ranks": str(members)}
            dump = dict(d, entries=ents, pg_config=pg_config, pg_status=statuses[r])
            (out / f"{PREFIX}{r + k * base}").write_bytes(pickle.dumps(dump, protocol=2))
            for e in ents:  # restore names for the next replica
                name, desc = e["process_group"]
                back = {v: n for n, v in rename.items()}
                e["process_group"] = (back.get(name, name), desc)


def measure(cmd: list[str], timeout_s: float, max_rss_gib: float = 1e9) -> dict[str, Any]:
    """Run cmd; wall seconds, exit code, peak RSS of the largest process and of the whole tree (MiB)."""
    # output goes to files, not pipes: a chatty tool must not block on a full pipe
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        start = time.perf_counter()
        proc = psutil.Popen(cmd, stdout=out_file, stderr=err_file, cwd=REPO)
        peak_tree = 0
        peak_one = 0
        timed_out = False
        while proc.poll() is None:
            try:
                procs = [proc, *proc.children(recursive=True)]
                rss = [p.memory_info().rss for p in procs if p.is_running()]
                peak_tree = max(peak_tree, sum(rss))
                peak_one = max(peak_one, max(rss, default=0))
            except psutil.Error:
                pass
            if time.perf_counter() - start > timeout_s or peak_tree > max_rss_gib * 2**30:
                for p in proc.children(recursive=True):
                    p.kill()
                proc.kill()
                timed_out = True
                break
            time.sleep(0.02)
        proc.wait()
        wall = time.perf_counter() - start
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    return {
        "wall_s": wall,
        "rc": proc.returncode,
        "timed_out": timed_out,
        "rss_one_mib": peak_one / 2**20,
        "rss_tree_mib": peak_tree / 2**20,
        "first_line": (out.decode(errors="replace").splitlines() or [""])[0][:100],
        "stderr_tail": err.decode(errors="replace")[-300:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", default=["512x2000", "4096x2000"], help="RANKSxENTRIES per set")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="corpus folder to replicate")
    ap.add_argument("--skip-reference", action="store_true", help="do not run torchfrtrace")
    ap.add_argument("--reference-timeout", type=float, default=600, help="seconds per torchfrtrace run")
    ap.add_argument(
        "--reference-max-rss-gib",
        type=float,
        default=10.0,
        help="stop torchfrtrace when its memory passes this (shared machines)",
    )
    ap.add_argument("--workers", type=int, default=None, help="--workers passed to sentinel fr analyze")
    ap.add_argument("--keep", type=Path, default=None, help="build the sets here and keep them")
    args = ap.parse_args()
    source = _load_source(args.source)
    root = args.keep or Path(tempfile.mkdtemp(prefix="frbench-"))
    rows = []
    try:
        for spec in args.sets:
            ranks, entries = (int(x) for x in spec.split("x"))
            ranks -= ranks % len(source)
            folder = root / f"{ranks}x{entries}"
            if not folder.exists():
                t = time.perf_counter()
                build_set(source, ranks, entries, folder)
                size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
                print(f"built {folder} ({size:.0f} MiB) in {time.perf_counter() - t:.1f} s", flush=True)
            cmd = [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder)]
            if args.workers:
                cmd += ["--workers", str(args.workers)]
            ours = measure(cmd, timeout_s=600)
            print(f"  sentinel: {ours['wall_s']:.2f} s rc={ours['rc']}  {ours['first_line']}", flush=True)
            ref = None
            if not args.skip_reference:
                exe = shutil.which("torchfrtrace", path=str(Path(sys.executable).parent)) or "torchfrtrace"
                ref = measure(
                    [exe, str(folder), "-p", PREFIX],
                    timeout_s=args.reference_timeout,
                    max_rss_gib=args.reference_max_rss_gib,
                )
                state = "STOPPED (time or memory cap)" if ref["timed_out"] else f"rc={ref['rc']}"
                print(f"  torchfrtrace: {ref['wall_s']:.2f} s {state}", flush=True)
            rows.append((spec, ranks, entries, ours, ref))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"cpus={os.cpu_count()}  source={args.source}")
    head = (
        f"{'set':>12} {'tool':>13} {'wall s':>9} {'RSS max MiB':>12} {'RSS tree MiB':>13} {'rc':>4}  speedup"
    )
    print(head)
    for spec, _ranks, _entries, ours, ref in rows:
        print(
            f"{spec:>12} {'sentinel':>13} {ours['wall_s']:9.2f} {ours['rss_one_mib']:12.0f} "
            f"{ours['rss_tree_mib']:13.0f} {ours['rc']:>4}"
        )
        if ref is not None:
            ratio = ref["wall_s"] / ours["wall_s"]
            mark = ">" if ref["timed_out"] else ""
            print(
                f"{spec:>12} {'torchfrtrace':>13} {mark}{ref['wall_s']:8.2f} {ref['rss_one_mib']:12.0f} "
                f"{ref['rss_tree_mib']:13.0f} {ref['rc'] if not ref['timed_out'] else 'T/O':>4}  {mark}{ratio:.1f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

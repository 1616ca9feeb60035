"""Sweep the real-torch jobs over culprit ranks and world sizes, and score ``sentinel fr analyze`` on them.

A tool, not a unit test (each job is a real torch.distributed run: seconds to a minute each). Run as::

    .venv/bin/python -m tests.fr.sweep [--out DIR] [--worlds 4,6,8,12] [--only SUBSTR ...] [--reuse]

Every case runs one job of :mod:`tests.fr.gloo_job` or :mod:`tests.fr.topo_job` with the culprit at rank
0, a middle rank and the last rank, over several world sizes (what the scenario's layout allows), one job
at a time. Each job records what it injected itself (``expected.json``: culprit, kind, the collective);
the sweep then runs ``python -m sentinel fr analyze DIR --json`` on the job's ``pickle/`` and ``json/``
folders — and on the NCCL-format version of the same run (:mod:`tests.fr.nccl_synth` for gloo_job,
:mod:`tests.fr.p2p_synth` for topo_job, from the job's ``meta/``) — and compares the verdict's kind,
culprit ranks and named collective with the injection. It prints a table and a score (rows that match /
rows analysed; a job that failed to run is listed apart, never scored).

What a row must say is derived from the injection, never from an analyzer:

* a rank that never entered a collective (``hang``, ``hang_world``, the topo hangs with a ``pg_name``):
  ``hang``, the culprit first, that collective; a rank that exited or aborted (``early_exit``,
  ``size_crash``): ``crash``, the culprit first, that collective;
* ``op_mismatch`` / ``bcast_size``: ``mismatch``, exactly the culprit, that collective;
* ``straggler``, ``straggler_async``: ``straggler``, exactly the culprit; healthy runs: ``healthy``, nobody;
* a send/recv never posted, under gloo (which does not record send/recv): ``hang`` with the culprit among
  the ranks named when some rank is blocked in a recorded collective (the job's ops log says so); the
  NCCL-format version must name the culprit first.

An ``inconclusive`` verdict that blames nobody where the truth is healthy, or where gloo cannot see the
fault (a send/recv never posted while no rank waits in a recorded collective), is scored ``weak``: no
false blame, no hit either (gloo's documented ambiguities: a pipeline after its run, ranks all inside one
collective when dumped on demand).

``--reuse`` keeps job folders already recorded under ``--out`` (re-analysing them after a fix); the
results go to ``OUT/sweep.json`` too. ``--save CASE NAME`` copies a recorded case into ``tests/data/fr/NAME``
as the regression sets are kept (dumps gzipped as PyTorch wrote them, the job's ``meta/`` and its
``expected.json``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fr import gloo_job, topo_job
from tests.fr.nccl_synth import members_from_meta, nccl_set
from tests.fr.p2p_synth import p2p_nccl_set

GLOO_FAULTS = (
    "hang",
    "hang_world",
    "op_mismatch",
    "bcast_size",
    "size_crash",
    "straggler",
    "straggler_async",
)
GLOO_HEALTHY = ("healthy", "ondemand")
#: topo scenarios swept, with their world sizes; pp_recv_hang and pp4_hang are pp_hang's program with
#: another culprit / size, which the sweep covers through pp_hang
TOPO_WORLDS = {
    "pp_hang": (4, 6, 8),
    "pp_group_hang": (4, 6),
    "pp_only_hang": (4, 5),
    "ring_hang": (4, 5),
    "mixed_hang": (4, 6),
    "subgroup_hang": (4, 6),
    "early_exit": (4, 5),
    "compute_stall_dp": (4, 6),
    "pp_healthy": (4, 6),
    "pp_ondemand": (4, 6),
}
P2P_KINDS = ("p2p_never_sent", "p2p_never_received", "p2p_never_posted")


@dataclass(frozen=True)
class Case:
    job: str  # "gloo" or "topo"
    scenario: str
    world: int
    culprit: int  # -1: a healthy run
    steps: int = 0  # gloo_job's steps; 0: the job's default

    @property
    def name(self) -> str:
        who = "healthy" if self.culprit < 0 else f"c{self.culprit}"
        return f"{self.job}-{self.scenario}-n{self.world}-{who}" + (f"-s{self.steps}" if self.steps else "")


@dataclass
class Row:
    case: Case
    fmt: str  # pickle, json, nccl
    got: dict[str, Any]
    misses: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.misses

    @property
    def status(self) -> str:
        if self.ok:
            return "ok"
        return "weak" if all(m.startswith("weak") for m in self.misses) else "MISS"


def culprits_for(world: int) -> list[int]:
    """Rank 0, a middle rank and the last rank."""
    return sorted({0, world // 2, world - 1})


def all_cases(worlds: list[int], steps: int = 0) -> list[Case]:
    out: list[Case] = []
    for world in worlds:
        out += [Case("gloo", s, world, c, steps) for s in GLOO_FAULTS for c in culprits_for(world)]
        out += [Case("gloo", s, world, -1, steps) for s in GLOO_HEALTHY]
    for scenario, sizes in TOPO_WORLDS.items():
        for world in sizes:
            if topo_job.CULPRIT[scenario] < 0:
                out.append(Case("topo", scenario, world, -1))
            else:
                out += [Case("topo", scenario, world, c) for c in culprits_for(world)]
    return out


def record(case: Case, folder: Path) -> dict[str, Any]:
    """Run the case's job into ``folder``; what it injected (its expected.json)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    culprit = None if case.culprit < 0 else case.culprit
    if case.job == "gloo":
        steps = case.steps or gloo_job.STEPS
        wait_s = 30 + gloo_job.pg_timeout_s(case.world)
        fact = gloo_job.run(case.scenario, case.world, folder, timeout_s=wait_s, steps=steps, culprit=culprit)
    else:
        fact = topo_job.run(case.scenario, folder, timeout_s=90, world=case.world, culprit=culprit)
    (folder / "recorded").write_text("1")
    return dict(fact)


def analyze_cli(folder: Path) -> dict[str, Any]:
    """``python -m sentinel fr analyze FOLDER --json``, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"verdict": f"error rc={proc.returncode}: {proc.stderr.strip()[-200:]}", "culprit_ranks": []}
    return data


def blocked_in_collective(folder: Path) -> bool:
    """Whether some rank's own ops log ends in a collective it entered and did not complete."""
    for path in (folder / "meta").glob("ops_rank_*.json"):
        ops = json.loads(path.read_text())
        if ops and ops[-1]["kind"] == "coll" and not ops[-1]["done"]:
            return True
    return False


def judge(case: Case, fmt: str, fact: dict[str, Any], got: dict[str, Any], folder: Path) -> list[str]:
    """What in ``got`` contradicts the injection ``fact`` (empty: the row matches)."""
    verdict, named = got.get("verdict"), list(got.get("culprit_ranks") or [])
    coll = got.get("collective") or {}
    culprit = int(fact.get("culprit", case.culprit))
    kind = str(fact.get("kind", case.scenario))
    misses: list[str] = []

    def want_verdict(*allowed: str) -> None:
        if verdict not in allowed:
            misses.append(f"verdict {verdict} (want {'/'.join(allowed)})")

    def want_collective(*keys: str) -> None:
        for key in keys:
            if key in fact and coll.get(key) != fact[key]:
                misses.append(f"collective {key} {coll.get(key)!r} (want {fact[key]!r})")

    if culprit < 0:
        if verdict == "inconclusive" and not named:
            misses.append("weak: inconclusive where the run was healthy")
        else:
            want_verdict("healthy")
        if named:
            misses.append(f"culprits {named} (want none)")
        return misses
    if kind in P2P_KINDS:
        if fmt == "nccl":
            want_verdict("hang")
            if named[:1] != [culprit]:
                misses.append(f"culprits {named} (want {culprit} first)")
        elif blocked_in_collective(folder):
            want_verdict("hang")
            if culprit not in named:
                misses.append(f"culprits {named} (want {culprit} among them)")
        elif verdict == "inconclusive" and not named:
            misses.append("weak: inconclusive (no rank waits in a recorded collective)")
        else:
            want_verdict("hang")
            if culprit not in named:
                misses.append(f"culprits {named} (want {culprit} among them)")
        return misses
    if kind in ("op_mismatch", "bcast_size"):
        want_verdict("mismatch")
        if named != [culprit]:
            misses.append(f"culprits {named} (want [{culprit}])")
        want_collective("pg_name", "seq", "op")
        return misses
    if kind in gloo_job.STRAGGLERS:
        want_verdict("straggler")
        if named != [culprit]:
            misses.append(f"culprits {named} (want [{culprit}])")
        return misses
    want_verdict("crash" if case.scenario in ("early_exit", "size_crash") else "hang")
    if named[:1] != [culprit]:
        misses.append(f"culprits {named} (want {culprit} first)")
    want_collective("pg_name", "seq", "op")
    return misses


def nccl_version(case: Case, folder: Path) -> Path:
    """The NCCL-format version of the run (synthesized from its real gloo dumps and its own meta)."""
    dst = folder / "nccl"
    if dst.exists():
        shutil.rmtree(dst)
    if case.job == "topo":
        return p2p_nccl_set(folder, dst)
    return nccl_set(folder / "pickle", dst, None, members=members_from_meta(folder / "meta"))


def sweep_case(case: Case, folder: Path, reuse: bool) -> tuple[list[Row], str]:
    """Rows for the case (pickle, json, nccl), or an empty list and why its job did not run."""
    if not (reuse and (folder / "recorded").exists()):
        try:
            record(case, folder)
        except (RuntimeError, TimeoutError, OSError) as exc:
            return [], f"{type(exc).__name__}: {exc}"
    fact = json.loads((folder / "expected.json").read_text()) if (folder / "expected.json").exists() else {}
    rows = []
    for fmt in ("pickle", "json", "nccl"):
        target = nccl_version(case, folder) if fmt == "nccl" else folder / fmt
        got = analyze_cli(target)
        rows.append(Row(case, fmt, got, judge(case, fmt, fact, got, folder)))
    return rows, ""


def save_set(folder: Path, dest: Path) -> None:
    """Copy a recorded job folder as a regression set: pickle/ and json/ gzipped, meta/, expected.json."""
    for sub in ("pickle", "json"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
        for f in sorted((folder / sub).iterdir()):
            (dest / sub / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes(), mtime=0))
    if (folder / "meta").is_dir():
        (dest / "meta").mkdir(exist_ok=True)
        for f in sorted((folder / "meta").iterdir()):
            shutil.copyfile(f, dest / "meta" / f.name)
    # (the topo sets name the job's record injected.json, beside the verdict.json written for them)
    fact = "injected.json" if (folder / "meta" / "ops_rank_0.json").exists() else "expected.json"
    shutil.copyfile(folder / "expected.json", dest / fact)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fr.sweep")
    parser.add_argument("--out", type=Path, default=Path("/tmp/sentinel-fr-sweep"))
    parser.add_argument("--worlds", default="4,6,8,12", help="gloo_job world sizes (even)")
    parser.add_argument("--steps", type=int, default=0, help="gloo_job steps (default: the job's)")
    parser.add_argument("--only", nargs="*", default=[], help="cases whose name contains one of these")
    parser.add_argument("--reuse", action="store_true", help="re-analyse job folders already recorded")
    parser.add_argument(
        "--recorded-only", action="store_true", help="with --reuse: run no job, skip the rest"
    )
    parser.add_argument("--save", nargs=2, metavar=("CASE", "NAME"), help="keep a case as tests/data/fr/NAME")
    args = parser.parse_args(argv)
    if args.save:
        case, name = args.save
        save_set(args.out / case, Path(__file__).resolve().parent.parent / "data" / "fr" / name)
        return 0
    # every rank warns (numpy absent from the CPU wheel, a deprecated all_gather name): noise in the table
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning,ignore::FutureWarning")
    cases = all_cases([int(w) for w in args.worlds.split(",") if w], args.steps)
    if args.only:
        cases = [c for c in cases if any(s in c.name for s in args.only)]
    if args.reuse and args.recorded_only:
        cases = [c for c in cases if (args.out / c.name / "recorded").exists()]
    rows: list[Row] = []
    failed: list[tuple[Case, str]] = []
    for case in cases:
        started = time.monotonic()
        got, why = sweep_case(case, args.out / case.name, args.reuse)
        rows += got
        if why:
            failed.append((case, why))
        marks = " ".join(f"{r.fmt}:{r.status}" for r in got) or f"job failed ({why})"
        print(f"{case.name:42} {time.monotonic() - started:6.1f}s  {marks}", flush=True)
    print()
    print(f"{'case':42} {'fmt':6} {'verdict':12} {'culprits':14} {'collective':22} result")
    for r in rows:
        c = r.got.get("collective") or {}
        what = f"{c.get('pg_name')}#{c.get('seq')} {c.get('op')}" if c else "-"
        culprits = str(r.got.get("culprit_ranks"))
        result = "ok" if r.ok else ("MISS: " if r.status == "MISS" else "") + "; ".join(r.misses)
        print(f"{r.case.name:42} {r.fmt:6} {r.got.get('verdict')!s:12} {culprits:14} {what:22} {result}")
    for case, why in failed:
        print(f"{case.name:42} job failed: {why}")
    hits = sum(r.ok for r in rows)
    weak = sum(r.status == "weak" for r in rows)
    print(
        f"\nscore: {hits}/{len(rows)} rows match the injection, {weak} weak (inconclusive, nobody blamed), "
        f"{len(rows) - hits - weak} miss(es); {len(failed)} job(s) failed to run"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(
        json.dumps(
            {
                "score": {"ok": hits, "weak": weak, "rows": len(rows)},
                "rows": [
                    {"case": r.case.name, "fmt": r.fmt, "status": r.status, "misses": r.misses, "got": r.got}
                    for r in rows
                ],
                "failed": [[c.name, why] for c, why in failed],
            },
            indent=1,
        )
    )
    return 0 if hits == len(rows) and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

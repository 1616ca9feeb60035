"""Evidence before action, end to end: a real torch gloo job, real agents, a real aggregator on 127.0.0.1.

Two ranks of a gloo job run on node-a, each started as its own program with its environment (what the
agent's job mapper reads), each on a GPU slot the fake GPU source lists its pid on. Rank 1 stops before a
gradient all_reduce, so rank 0 hangs inside it. The stuck verdict opens an incident; node-a's agent reads
both ranks' Python stacks with py-spy — rank 0's names ``all_reduce`` and the training script's line that
called it — with the GPU's nvidia-smi-shaped snapshot, and the incident carries them before the (dry-run)
drain the remediation policy asks for.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sentinel.agent.nvml.recording import parse
from sentinel.agent.stacks import find_py_spy
from sentinel.config.aggregator import (
    AggregatorConfig,
    BreakerConfig,
    FleetConfig,
    IncidentsConfig,
    RemediationConfig,
    RemediationRule,
)
from tests.aggregator.helpers import running_aggregator
from tests.integration.harness import START_WITHIN_S, Cluster, Job, agents, hang_until_stuck, until
from tests.integration.harness import verdicts as harness_verdicts
from tests.support import REPO, need, need_module

HUNG = 1  # stops before its gradient all_reduce
WAITING = 0  # blocks inside that all_reduce
DETECT_WITHIN_S = 10.0
TRAIN = REPO / "tests" / "integration" / "gloo_train.py"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(START_WITHIN_S + 150)]


def line_of(text: str) -> int:
    """The line number of the training script's line that is ``text`` (stripped)."""
    lines = TRAIN.read_text().splitlines()
    (number,) = [i + 1 for i, line in enumerate(lines) if line.strip() == text]
    return number


def two_ranks_exec(spec: dict[str, Any]) -> dict[str, Any]:
    """Ranks 0 and 1 only (both node-a, GPU slots 0 and 1), each its own program."""
    return {**spec, "ranks": spec["ranks"][:2], "exec": True}


def fake_sinfo(path: Path) -> str:
    """An sinfo that shows both hosts idle (the dry-run drain reads the node's state first)."""
    rows = "".join(f"{h}\\037idle\\037unknown\\037unknown\\037none\\n" for h in ("node-a", "node-b"))
    path.write_text(f"#!/bin/sh\nprintf '{rows}'\n")
    path.chmod(0o755)
    return str(path)


def frames_of(stack: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for thread in stack["threads"] for f in thread["frames"]]


async def test_stuck_rank_stacks_and_gpu_snapshot_are_attached_before_the_drain(tmp_path: Path) -> None:
    need_module("torch")
    need(find_py_spy() is not None, "py-spy not installed (pip install 'sentinel[stacks]')")
    sockets = Path(tempfile.mkdtemp(prefix="snt-"))
    cluster = Cluster(tmp_path, sockets)
    remediation = RemediationConfig(
        enabled=True,
        dry_run=True,
        sinfo=fake_sinfo(tmp_path / "sinfo"),
        scontrol="/bin/false",
        rules=[RemediationRule(kind="stuck", do="drain"), *RemediationConfig().rules],
        breaker=BreakerConfig(max_drains=10, max_fraction=1.0, max_unavailable_fraction=1.0),
    )
    config = AggregatorConfig(
        fleet=FleetConfig(tick_s=0.5),
        incidents=IncidentsConfig(snapshot_timeout_s=5.0, evidence_timeout_s=20.0),
        remediation=remediation,
    )
    job: Job | None = None
    try:
        async with (
            running_aggregator(tmp_path / "aggregator", config) as running,
            agents(cluster, running) as (node_a, _),
            aiohttp.ClientSession() as session,
        ):
            url = running.url
            job = Job(cluster, "train-evidence", edit=two_ranks_exec)
            hang_job = job

            async def reporting() -> bool:
                async with session.get(f"{url}/api/v1/jobs/{hang_job.id}") as response:
                    ranks = (await response.json()).get("rank_list") or [] if response.status == 200 else []
                return len(ranks) == 2

            await until("both ranks report", reporting, START_WITHIN_S, job)
            pids = job.rank_pids()
            node_a.source.pids = {0: [pids[0]], 1: [pids[1]]}  # type: ignore[attr-defined]

            async def mapped() -> bool:
                procs = node_a.sink.procs()
                return sorted((p.rank, p.pid) for p in procs if p.job_id == hang_job.id) == [
                    (0, pids[0]),
                    (1, pids[1]),
                ]

            await until("the agent maps both ranks to GPU slots", mapped, 30, job)

            verdict, _ = await hang_until_stuck(session, url, job, HUNG, DETECT_WITHIN_S)
            assert (verdict["host"], verdict["rank"], verdict["gpu"]) == ("node-a", HUNG, HUNG), verdict
            incident_id = verdict["incident"]
            assert incident_id

            async def evidence() -> dict[str, Any] | None:
                async with session.get(f"{url}/api/v1/incidents/{incident_id}") as response:
                    incident = await response.json() if response.status == 200 else {}
                return incident.get("evidence")

            report = await until("incident evidence", evidence, 60, job)
            assert report["state"] == "done" and report["missing_hosts"] == [], report
            answer = report["hosts"]["node-a"]
            stacks = {s["rank"]: s for s in answer["stacks"]}
            assert sorted(stacks) == [WAITING, HUNG], json.dumps(answer["stacks"])[:3000]
            assert {s["pid"] for s in stacks.values()} == set(pids)

            assert not stacks[WAITING].get("error"), stacks[WAITING]
            # the thread blocked in the collective: all_reduce, above the script's line that called it
            called_at = line_of("dist.all_reduce(grad)")
            (waiting,) = [
                t["frames"]
                for t in stacks[WAITING]["threads"]
                if any(f["name"] == "all_reduce" for f in t["frames"])
            ]
            names = [f["name"] for f in waiting]
            (script,) = [
                i
                for i, f in enumerate(waiting)
                if f["file"].endswith("gloo_train.py") and f["line"] == called_at
            ]
            assert names.index("all_reduce") < script and names[script] == "run_rank", names

            hung = frames_of(stacks[HUNG])
            slept_at = line_of("time.sleep(1.0)")
            assert any(f["file"].endswith("gloo_train.py") and f["line"] == slept_at for f in hung), hung

            (gpu,) = [g for g in answer["gpus"] if g["gpu"] == HUNG]
            root = parse(gpu["xml"].encode())
            assert root.tag == "nvidia_smi_log"
            node = root.find("gpu/uuid")
            assert node is not None and node.text == node_a.sink.gpus[HUNG].info.uuid
            assert answer["kernel_window"][1] - answer["kernel_window"][0] > 0

            async def drained() -> list[dict[str, Any]] | None:
                for v in await harness_verdicts(session, url):
                    if v["id"] == verdict["id"] and v.get("remediation"):
                        return list(v["remediation"])
                return None

            (record,) = await until("the dry-run drain", drained, 30, job)
            assert record["outcome"] == "dry_run" and record["node"] == "node-a", record
            assert record["t"] >= report["finished_at"], (record, report)
    finally:
        if job is not None:
            job.kill()
        shutil.rmtree(sockets, ignore_errors=True)

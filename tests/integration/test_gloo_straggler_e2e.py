"""End to end over real sockets: a slow rank of a real torch.distributed gloo job is named a straggler.

The harness of test_gloo_e2e.py (8 CPU ranks with the probe, two real agents, a real aggregator on
127.0.0.1). The ranks' step compute times come from the probe's step clock on gloo's real counters
(sentinel/fr/steps.py), travel in their heads through the agents, and the aggregator's straggler detector
compares them. One job runs throughout:

1. healthy: once every rank is judged (its median compute per step known to the aggregator), it stays
   judged for as long as a straggler takes to be named below, and no verdict of any kind opens;
2. rank 0, then the last rank, computes ``SLOW_EXTRA_S`` longer each step (CONTROL/slow: the fault
   injected in the rank's compute phase): a straggler verdict names that rank, its host and GPU, and the job,
   with the compute evidence, within ``NAME_WITHIN_S``; the first verdict closes once its rank recovers;
3. rank 0 stops before a gradient all_reduce its peers enter (CONTROL/hang): a stuck verdict names it, its
   host and GPU within ``DETECT_WITHIN_S`` (the hang test's culprit is a middle rank; this is the first);
   no verdict ever named a rank that was neither slowed nor hung, nor a straggler as stuck.

The detectors run at their defaults but for the evaluation interval (1 s instead of 5 s, so a straggler is
named after ``persistence`` = 4 evaluations in ~5 s instead of ~20 s): a verdict still needs the same four
evaluations in a row, and the healthy phase, judged four to five times as often, is the stricter check.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sentinel.config.aggregator import AggregatorConfig, DetectConfig, FleetConfig, StragglerConfig
from tests.aggregator.helpers import running_aggregator
from tests.integration.harness import (
    GPUS_PER_HOST,
    START_WITHIN_S,
    WORLD,
    Cluster,
    Job,
    agents,
    all_ranks_report,
    get_json,
    hang_until_stuck,
    host_of,
    until,
)
from tests.integration.harness import verdicts as harness_verdicts
from tests.support import need_module

STRAGGLER = StragglerConfig(eval_interval_s=1.0)
#: the ranks slowed in turn: both ends of the rank order (the middle one is the hang test's)
SLOWED = (0, WORLD - 1)
#: each step's compute is the job's 50 ms sleep; a straggler computes this much longer (2x)
SLOW_EXTRA_S = 0.05
#: every rank judged: the hosts' clock rates gate the judging for 20-30 s after the agents are first heard
#: (sentinel/aggregator/clock.py), and each rank needs ``min_steps`` steps
JUDGED_WITHIN_S = 60.0
#: persistence evaluations in a row, the step history turning over, and margin for a loaded machine
NAME_WITHIN_S = STRAGGLER.eval_interval_s * (STRAGGLER.persistence + 1) + 10.0
#: the rank stopped at the end, and how soon the stuck detector must name it (as in test_gloo_e2e.py)
HUNG = 0
DETECT_WITHIN_S = 10.0

pytestmark = pytest.mark.timeout(START_WITHIN_S + JUDGED_WITHIN_S + 4 * NAME_WITHIN_S + DETECT_WITHIN_S + 60)


def _slow(job: Job, rank: int | None, extra_s: float = SLOW_EXTRA_S) -> None:
    """Name the slow rank in CONTROL/slow (or none), replaced whole: the ranks read it every step."""
    tmp = job.control / ".slow.tmp"
    tmp.write_text("" if rank is None else f"{rank} {extra_s}")
    os.replace(tmp, job.control / "slow")


async def test_a_slow_rank_at_either_end_is_named_a_straggler_a_healthy_job_is_not_and_rank_0_hung_is_stuck(
    tmp_path: Path,
) -> None:
    need_module("torch")
    sockets = Path(tempfile.mkdtemp(prefix="snt-"))
    cluster = Cluster(tmp_path, sockets)
    config = AggregatorConfig(fleet=FleetConfig(tick_s=0.5), detect=DetectConfig(straggler=STRAGGLER))
    job: Job | None = None
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        async with (
            running_aggregator(tmp_path / "aggregator", config) as running,
            agents(cluster, running),
            aiohttp.ClientSession() as session,
        ):
            url = running.url
            job = Job(cluster, "train-straggler")

            async def verdicts() -> list[dict[str, Any]]:
                return await harness_verdicts(session, url)

            async def ranks() -> list[dict[str, Any]]:
                assert job is not None
                return list((await get_json(session, f"{url}/api/v1/jobs/{job.id}"))["rank_list"])

            await until("ranks report", lambda: all_ranks_report(session, url, job), START_WITHIN_S, job)
            timings["reporting_s"] = time.monotonic() - started

            async def every_rank_judged() -> list[dict[str, Any]] | None:
                listed = await ranks()
                judged = len(listed) == WORLD and all(r["compute_ms"] is not None for r in listed)
                return listed if judged else None

            # 1. healthy: judged, and judged healthy for as long as naming a straggler takes
            judged = await until("every rank judged", every_rank_judged, JUDGED_WITHIN_S, job)
            timings["judged_s"] = time.monotonic() - started
            print("healthy compute:", [(r["rank"], r["compute_ms"], r["slowdown"]) for r in judged])
            observe_end = time.monotonic() + NAME_WITHIN_S
            while time.monotonic() < observe_end:
                early = await verdicts()
                assert early == [], json.dumps(early, indent=1)
                assert all(r["compute_ms"] is not None for r in await ranks()), "a healthy rank left judging"
                assert job.proc.poll() is None, job.output()
                await asyncio.sleep(0.5)

            # 2. each end of the rank order slowed in turn
            named: dict[int, dict[str, Any]] = {}
            for culprit in SLOWED:
                _slow(job, culprit)
                slowed_at = time.monotonic()

                async def culprit_named(culprit: int = culprit) -> dict[str, Any] | None:
                    return next(
                        (
                            v
                            for v in await verdicts()
                            if v["kind"] == "straggler" and v["rank"] == culprit and v["state"] == "open"
                        ),
                        None,
                    )

                verdict = await until(
                    f"straggler verdict on rank {culprit}", culprit_named, NAME_WITHIN_S, job
                )
                timings[f"named_rank_{culprit}_s"] = time.monotonic() - slowed_at
                assert verdict["job"] == job.id, verdict
                assert (verdict["host"], verdict["gpu"]) == (host_of(culprit), culprit % GPUS_PER_HOST), (
                    verdict
                )
                assert verdict["reason"] == "unknown", verdict  # its (fake) GPU reports no cause
                assert any(line.startswith(f"rank {culprit} computes ") for line in verdict["evidence"]), (
                    verdict
                )
                listed = {r["rank"]: r for r in await ranks()}
                assert listed[culprit]["slowdown"] >= 1 + STRAGGLER.min_slowdown, listed[culprit]
                print(
                    f"rank {culprit} named:",
                    verdict["evidence"],
                    [(r, v["compute_ms"]) for r, v in listed.items()],
                )
                named[culprit] = verdict

            # the first slowed rank recovered while the second was slow: its verdict closed
            first = SLOWED[0]

            async def first_closed() -> bool:
                return any(v["id"] == named[first]["id"] and v["state"] == "closed" for v in await verdicts())

            await until(f"rank {first}'s verdict closes", first_closed, NAME_WITHIN_S, job)

            # 3. rank 0 stops before a gradient all_reduce: named stuck, never a waiting peer
            _slow(job, None)
            stuck, stopped_at = await hang_until_stuck(session, url, job, HUNG, DETECT_WITHIN_S)
            timings["stuck_named_s"] = stuck["opened_at"] - stopped_at
            assert stuck["job"] == job.id and stuck["reason"] == "not_entered_collective", stuck
            assert (stuck["rank"], stuck["host"], stuck["gpu"]) == (HUNG, host_of(HUNG), HUNG % GPUS_PER_HOST)
            assert stuck["opened_at"] - stopped_at <= DETECT_WITHIN_S, timings
            for v in await verdicts():
                slowed = v["kind"] == "straggler" and v["rank"] in SLOWED
                assert v["job"] == job.id and (slowed or (v["kind"], v["rank"]) == ("stuck", HUNG)), v
    finally:
        if job is not None:
            job.kill()
        shutil.rmtree(sockets, ignore_errors=True)
        timings["total_s"] = time.monotonic() - started
        print("timings:", json.dumps({k: round(v, 2) for k, v in timings.items()}))

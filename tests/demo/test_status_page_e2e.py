"""End to end: during a short demo, headless Chromium loads the aggregator's status page at ``/`` and the
injected faults are on it — open verdicts on the right GPUs, those GPUs among the problem GPUs, the stalled
job, and an incident."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any

import aiohttp

from sentinel.demo import scenarios
from sentinel.demo.outcome import ACCEPTED_KINDS
from sentinel.demo.run import DemoOptions, run_demo
from tests.demo.chromium import dump_dom
from tests.demo.helpers import SHORT, tune_for_short_runs
from tests.demo.test_status_page_browser import rows
from tests.support import need_binary


async def wait_for_verdicts(
    base: str, wanted: set[tuple[str, int]], timeout_s: float
) -> list[dict[str, Any]]:
    """Poll the API until an open verdict names every (host, gpu) in ``wanted``."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(base + "api/v1/verdicts?state=open") as resp:
                verdicts: list[dict[str, Any]] = (await resp.json())["verdicts"]
            if wanted <= {(v["host"], v["gpu"]) for v in verdicts}:
                return verdicts
            assert time.monotonic() < deadline, f"verdicts after {timeout_s}s: {verdicts}"
            await asyncio.sleep(0.5)


async def test_status_page_shows_the_injected_faults_during_a_demo(tmp_path: Path) -> None:
    chromium = need_binary("chromium")
    faults = scenarios.faults_of(scenarios.load(SHORT))
    loop = asyncio.get_running_loop()
    url: asyncio.Future[str] = loop.create_future()
    stop = asyncio.Event()
    demo = asyncio.create_task(
        run_demo(
            DemoOptions(
                scenario_path=SHORT,
                view="plain",
                settle_s=0.0,
                tune_aggregator=tune_for_short_runs,
                on_ready=url.set_result,
            ),
            stop=stop,
            out=io.StringIO(),
        )
    )
    try:
        base = await asyncio.wait_for(asyncio.shield(url), 20)
        await wait_for_verdicts(base, {(f.host, f.gpu) for f in faults if f.gpu is not None}, timeout_s=45)
        dom = await dump_dom(chromium, base, tmp_path / "profile", budget_ms=6000)
    finally:
        stop.set()
        result = await asyncio.wait_for(demo, 30)
    assert result.outcome.all_caught, result.summary

    verdict_rows = rows(dom, "verdict")
    problem_rows = {(r["host"], r["gpu"]): r["state"] for r in rows(dom, "problem")}
    for fault in faults:
        on_gpu = [r for r in verdict_rows if (r["host"], r["gpu"]) == (fault.host, str(fault.gpu))]
        assert any(r["kind"] in ACCEPTED_KINDS[fault.kind] for r in on_gpu), (fault, verdict_rows)
        assert (fault.host, str(fault.gpu)) in problem_rows, (fault, problem_rows)
    # no GPU other than the faulty ones is shown as a problem (waiting peers are not blamed on the page)
    assert set(problem_rows) == {(f.host, str(f.gpu)) for f in faults}
    jobs = {r["job"]: r["state"] for r in rows(dom, "job")}
    assert jobs["finetune"] == "stalled"
    assert "4 hosts · 32 GPUs" in dom
    assert '<li data-id="' in dom  # at least one incident listed (the stall and the Xid 79 record one)

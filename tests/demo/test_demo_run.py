"""A short demo end to end: real agents on simulated hosts → WebSocket → real aggregator, on 127.0.0.1.

The wall-clock smoke test of the demo; its verdict logic is checked on virtual time, independent of the
machine's load, by tests/demo/test_demo_virtual.py.

The compressed scenario (tests/demo/data/short.toml) injects the built-in scenario's four faults within
12 s on 4 hosts. The test watches the aggregator's API on its own, next to the demo, and checks that every
fault was caught by a verdict on the right GPU, that nothing was flagged wrongly, and that the summary says
exactly that.
"""

from __future__ import annotations

import asyncio
import io
import re
from typing import Any

import aiohttp

from sentinel.demo.outcome import detection_bound_s
from sentinel.demo.run import DemoOptions, run_demo
from tests.demo.helpers import SHORT, tune_for_short_runs


async def watch_verdicts(
    url: asyncio.Future[str], seen: dict[str, dict[str, Any]], stop: asyncio.Event
) -> None:
    base = await url
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            try:
                async with session.get(base + "api/v1/verdicts") as resp:
                    for v in (await resp.json())["verdicts"]:
                        seen[v["id"]] = v
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.5)


async def test_short_demo_catches_every_fault_and_summarises_it() -> None:
    loop = asyncio.get_running_loop()
    url: asyncio.Future[str] = loop.create_future()
    seen: dict[str, dict[str, Any]] = {}
    done = asyncio.Event()
    watcher = asyncio.create_task(watch_verdicts(url, seen, done))
    out = io.StringIO()
    try:
        result = await asyncio.wait_for(
            run_demo(
                DemoOptions(
                    scenario_path=SHORT,
                    view="plain",
                    settle_s=8.0,
                    tune_aggregator=tune_for_short_runs,
                    on_ready=url.set_result,
                ),
                out=out,
            ),
            timeout=75,
        )
    finally:
        done.set()
        await watcher
    text = out.getvalue()
    assert result.outcome.all_caught, text
    assert result.outcome.wrong == (), text
    assert result.exit_code == 0
    assert not result.interrupted
    assert len(result.outcome.catches) == 4
    for catch in result.outcome.catches:
        fault, verdict = catch.fault, catch.verdict
        assert verdict is not None
        assert (verdict.host, verdict.gpu) == (fault.host, fault.gpu)
        assert catch.delay_s is not None and catch.delay_s <= detection_bound_s(fault.kind), catch
        # the verdict exists in the aggregator's API as the test saw it, with the same place and kind
        api = seen[verdict.id]
        assert (api["host"], api["gpu"], api["kind"]) == (fault.host, fault.gpu, verdict.kind)
        # the summary has one line for the fault naming the verdict and the delay
        line = next(
            line for line in text.splitlines() if line.startswith(f"t+{fault.at_s:.0f}s {fault.describe()}")
        )
        assert fault.where() in line
        assert f"{verdict.kind} {verdict.reason} -> {verdict.action}" in line
        shown = re.search(r"(\d+\.\d+)s$", line.rstrip())
        assert shown is not None and abs(float(shown.group(1)) - catch.delay_s) <= 0.05, line
    assert "caught 4 of 4 injected faults" in text
    assert "flagged wrongly: none" in text
    # the plain view narrated the run as it happened
    assert len(re.findall(r"fault injected: ", text)) == 4
    assert "verdict opened: stuck on host-003 gpu 2" in text
    # no waiting peer of the hung rank was ever blamed, by the API's own account
    blamed = {(v["host"], v["gpu"]) for v in seen.values() if v["kind"] == "stuck"}
    assert blamed <= {("host-003", 2), ("host-000", 6)}, blamed

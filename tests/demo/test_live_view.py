"""The demo's live view as a person sees it: the short demo run with ``view="live"`` into a text buffer.

What once went wrong there: the daemons' JSON log lines were written over the view, every one labelled
``host="demo"``, and evidence showed raw epoch floats (``t=1.79611e+09``). The log lines under the view must be
readable text naming the simulated host (or the aggregator) they come from, and evidence must carry
human times.
"""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from sentinel.demo import scenarios
from sentinel.demo.run import DemoOptions, run_demo
from tests.demo.helpers import SHORT, tune_for_short_runs

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?Z? \[\s*(debug|info|warning|error|critical)\s*\]"
)
EPOCH = re.compile(r"\b1\d{9}(\.\d+)?\b|\d\.\d+e\+0?9")


async def test_the_live_view_shows_readable_logs_of_the_real_hosts_and_human_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.setenv("LINES", "120")  # room under the frame for the log tail
    out = io.StringIO()
    result = await asyncio.wait_for(
        run_demo(
            DemoOptions(
                scenario_path=SHORT,
                view="live",
                color=False,
                log_level="info",
                settle_s=8.0,
                tune_aggregator=tune_for_short_runs,
            ),
            out=out,
        ),
        timeout=75,
    )
    assert result.outcome.all_caught
    screen = [ESCAPES.sub("", line).rstrip() for line in out.getvalue().splitlines()]
    hosts = set(scenarios.load(SHORT).host_names())
    logs = [line for line in screen if LOG_LINE.match(line)]
    assert logs, "no log line was shown under the live view"
    assert not [line for line in screen if line.lstrip().startswith("{")]  # never JSON
    named = {m.group(1) for line in logs for m in [re.search(r"\bhost=([\w.-]+)", line)] if m}
    assert named and named <= hosts | {"aggregator"}, named
    assert named & hosts, "no agent's log line named its simulated host"
    assert not any("host=demo" in line for line in logs)
    evidence = [line for line in screen if line.lstrip().startswith("evidence:")]
    assert evidence, "no verdict evidence was shown"
    assert not [line for line in evidence if EPOCH.search(line)], "evidence shows raw epoch times"

"""Orchestration of ``sentinel demo``: aggregator + real agents on simulated hosts, in real time, on 127.0.0.1.

Everything runs in this one process and event loop, but over the real network stack: the aggregator listens
on 127.0.0.1 (API, status page, the agents' WebSocket stream with a bearer token); each simulated host gets a
real :class:`sentinel.agent.agent.Agent` reading the simulator's host at its OS boundaries (GPU source, kernel
log records, NCCL debug files, process table, probe datagrams, IB ports: ``SimHost.inputs()``); the demo
watches the outcome through the aggregator's REST API, like an operator would. One process keeps it
runnable on two cores (no interpreter start-up per host, no IPC besides the sockets being demonstrated).

Stopping (duration over, Ctrl-C, or the ``stop`` event) ends the same way every time: a short settle period
for faults still inside their detection bound, a last poll, agents stopped (their streams drained and
closed), the aggregator cleaned up (listener and every connection closed), tasks cancelled and awaited, the
temporary state folder removed; then the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from sentinel.config.aggregator import AggregatorConfig
from sentinel.demo import hooks, scenarios
from sentinel.demo.hooks import DemoError
from sentinel.demo.model import DemoInfo, Snapshot, ViewModel, build_view
from sentinel.demo.narrate import Narrator
from sentinel.demo.outcome import Fault, Outcome, detection_bound_s, evaluate
from sentinel.demo.summary import render_summary
from sentinel.demo.view import HIDE_CURSOR, SHOW_CURSOR, frame_text, render_frame
from sentinel.demo.watch import ApiWatcher
from sentinel.log import setup_logging
from sentinel.sim.scenario import Scenario

#: After the end, wait at most this long for verdicts on faults injected shortly before it (hardware 3 s,
#: hang 10 s bounds; a straggler injected in the last minute is reported as missed rather than waited for).
SETTLE_S = 12.0
POLL_S = 1.0
AGENT_STOP_S = 6.0


@dataclass
class DemoOptions:
    scenario_path: Path | None = None
    hosts: int | None = None
    duration_s: float | None = None
    port: int = 0
    view: Literal["auto", "live", "plain"] = "auto"
    state_dir: Path | None = None
    log_level: str = "warning"
    color: bool = True
    settle_s: float = SETTLE_S
    poll_s: float = POLL_S
    #: Tests tighten detector settings (e.g. straggler persistence) to fit a short run: applied to the
    #: aggregator's configuration before it starts.
    tune_aggregator: Callable[[AggregatorConfig], None] | None = None
    #: Called once with the status page URL when the aggregator is listening.
    on_ready: Callable[[str], None] | None = None


@dataclass
class DemoResult:
    outcome: Outcome
    faults: list[Fault]
    ran_s: float
    interrupted: bool
    summary: str
    url: str
    scenario: Scenario
    snapshots: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when no injected fault was missed (caught, or still within its bound at the end), 1 otherwise."""
        return 0 if self.outcome.all_caught else 1


class _LogTail(io.StringIO):
    """A text stream for structlog while the live view owns the terminal: keeps the last lines in memory."""

    def __init__(self, keep: int = 200) -> None:
        super().__init__()
        self.lines: list[str] = []
        self._keep = keep
        self._partial = ""

    def write(self, text: str) -> int:
        self._partial += text
        *done, self._partial = self._partial.split("\n")
        self.lines.extend(line for line in done if line)
        del self.lines[: -self._keep]
        return len(text)

    def isatty(self) -> bool:
        return False


def _use_live_view(mode: str, out: TextIO) -> bool:
    if mode != "auto":
        return mode == "live"
    try:
        return out.isatty() and os.environ.get("TERM", "") not in ("", "dumb")
    except (AttributeError, ValueError):
        return False


class _Screen:
    """Live view or plain lines on ``out``; one call per poll."""

    def __init__(self, out: TextIO, live: bool, color: bool, logs: _LogTail | None) -> None:
        self.out = out
        self.live = live
        self.color = color and "NO_COLOR" not in os.environ
        self.logs = logs
        self.narrator = Narrator()
        self._started = False

    def show(self, vm: ViewModel) -> None:
        if not self.live:
            for line in self.narrator.lines(vm):
                self.out.write(line + "\n")
            self.out.flush()
            return
        if not self._started:
            self.out.write(HIDE_CURSOR + "\x1b[2J")
            self._started = True
        size = shutil.get_terminal_size((100, 40))
        lines = render_frame(vm, size.columns, max(5, size.lines - 1), self.color)
        if self.logs is not None and self.logs.lines:
            room = max(0, size.lines - 1 - len(lines))
            lines += [line[: size.columns] for line in self.logs.lines[-min(room, 3) :]] if room else []
        self.out.write(frame_text(lines))
        self.out.flush()

    def close(self) -> None:
        if self.live and self._started:
            self.out.write(SHOW_CURSOR)
            self.out.flush()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))


def _unsettled(faults: list[Fault], outcome: Outcome, t_s: float) -> bool:
    """Some injected fault has no verdict yet but is still within its detection bound."""
    caught = {c.fault.index for c in outcome.catches if c.verdict is not None}
    return any(f.index not in caught and f.at_s <= t_s < f.at_s + detection_bound_s(f.kind) for f in faults)


async def run_demo(
    options: DemoOptions,
    *,
    stop: asyncio.Event | None = None,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.time,
) -> DemoResult:
    """Run one demo to its end (duration, or ``stop`` set) and return the outcome; prints view and summary.

    Raises :class:`sentinel.sim.scenario.ScenarioError` for a bad scenario and
    :class:`~sentinel.demo.hooks.DemoError` when the aggregator cannot listen or the state folder is unusable
    (both one line, before anything started).
    """
    out = out if out is not None else sys.stdout
    stop = stop if stop is not None else asyncio.Event()
    scenario = scenarios.load(options.scenario_path, options.hosts, options.duration_s)
    faults = scenarios.faults_of(scenario)
    live = _use_live_view(options.view, out)
    logs = _LogTail() if live else None
    # in the live view, log lines are shown as readable text under it (never JSON), each with its host
    setup_logging(
        "demo",
        options.log_level,
        host="aggregator",
        stream=logs if logs is not None else sys.stderr,
        json=False if logs is not None else None,
    )

    temp: tempfile.TemporaryDirectory[str] | None = None
    if options.state_dir is None:
        temp = tempfile.TemporaryDirectory(prefix="sentinel-demo-")
        state = Path(temp.name)
    else:
        state = options.state_dir
        try:
            state.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DemoError(f"state folder {state}: {exc.strerror or exc}") from None
    screen = _Screen(out, live, options.color, logs)
    stack = contextlib.AsyncExitStack()
    try:
        token = secrets.token_urlsafe(32)
        tokens_file = state / "token"
        fd = os.open(tokens_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")

        aggregator = await stack.enter_async_context(
            hooks.aggregator(
                state_dir=state / "aggregator",
                token=token,
                port=options.port,
                tick_s=scenario.tick_s,
                clock=clock,
                tune=options.tune_aggregator,
            )
        )
        base_url = f"http://127.0.0.1:{aggregator.port}"
        url = base_url + "/"
        if options.on_ready is not None:
            options.on_ready(url)
        started_at = clock()
        cluster = await stack.enter_async_context(
            hooks.simulated_cluster(
                scenario,
                started_at=started_at,
                clock=clock,
                stream_url=f"ws://127.0.0.1:{aggregator.port}/api/v1/stream",
                token_file=tokens_file,
                state_dir=state / "agents",
            )
        )
        info = DemoInfo(
            scenario=scenario.name,
            hosts=cluster.host_names,
            gpus_per_host=scenario.cluster.gpus_per_host,
            duration_s=scenario.duration_s,
            faults=faults,
            url=url,
        )
        if not live:
            out.write(
                f"sentinel demo: scenario {scenario.name}, {len(info.hosts)} hosts x {info.gpus_per_host} GPUs, "
                f"{len(faults)} faults over {scenario.duration_s:g}s; status page {url}\n"
            )
            out.flush()
        watcher = await stack.enter_async_context(ApiWatcher(base_url, started_at, clock=clock))
        snap = Snapshot(t_s=0.0)
        polls = 0
        loop = asyncio.get_running_loop()
        next_poll = loop.time()
        settle_until: float | None = None
        while True:
            snap = await watcher.poll()
            polls += 1
            vm = build_view(info, snap)
            screen.show(vm)
            if stop.is_set():
                break
            if snap.t_s >= scenario.duration_s:
                if settle_until is None:
                    settle_until = snap.t_s + options.settle_s
                if snap.t_s >= settle_until or not _unsettled(faults, vm.outcome, snap.t_s):
                    break
            if cluster.failed is not None:
                raise DemoError(f"simulated cluster stopped: {cluster.failed}")
            next_poll += options.poll_s
            await _sleep_or_stop(stop, next_poll - loop.time())
        interrupted = stop.is_set()
        ran_s = clock() - started_at
        outcome = evaluate(faults, watcher.verdicts, min(ran_s, snap.t_s))
    finally:
        screen.close()
        await stack.aclose()
        if temp is not None:
            temp.cleanup()
    summary = render_summary(outcome, faults, scenario=scenario.name, ran_s=ran_s, interrupted=interrupted)
    if live:
        out.write("\n")
    out.write(summary)
    out.flush()
    return DemoResult(
        outcome=outcome,
        faults=faults,
        ran_s=ran_s,
        interrupted=interrupted,
        summary=summary,
        url=url,
        scenario=scenario,
        snapshots=polls,
    )

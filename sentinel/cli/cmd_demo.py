"""``sentinel demo``: a simulated cluster against a real aggregator on 127.0.0.1, with injected faults.

Starts the aggregator (with its status page) and one real agent per simulated host in this process, talking
over WebSockets on 127.0.0.1; runs the scenario in real time while a live view shows the jobs, the hosts x
GPUs grid and the verdicts as they open; at the end prints which verdict caught each injected fault and
after how long. Exit 0 when every injected fault was caught (a fault still within its detection bound at
the end is pending, not missed), 1 when one was missed, 2 on bad input.
Ctrl-C ends the run early (the summary still prints); a second Ctrl-C stops without waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from sentinel.sim.scenario import ScenarioError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, not {value}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run a simulated cluster against a real aggregator on 127.0.0.1 with injected faults",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="scenario TOML file (format: docs/scenarios.md); default: the built-in 16-host scenario with a "
        "thermal straggler, a stuck rank, a pending row remap and an Xid 79 over two minutes",
    )
    p.add_argument(
        "--hosts",
        type=_positive_int,
        metavar="N",
        help="simulate N hosts instead of the scenario's count (its jobs and faults are mapped proportionally)",
    )
    p.add_argument(
        "--duration",
        type=_positive_float,
        metavar="SECONDS",
        help="run this long (default: the scenario's duration_s); faults scheduled later are not injected",
    )
    p.add_argument(
        "--port",
        type=_port,
        default=0,
        help="aggregator port on 127.0.0.1 (API, status page, agents' stream); 0 = any free port (default)",
    )
    p.add_argument(
        "--view",
        choices=("auto", "live", "plain"),
        default="auto",
        help="live: redraw a terminal view in place; plain: log lines; auto (default): live on a terminal",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="keep the aggregator's state (incident database and timelines) and the agents' spools in DIR "
        "(default: a temporary folder removed at the end)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="level of the aggregator's and agents' own log lines (default: warning)",
    )
    p.add_argument(
        "--no-color",
        action="store_true",
        help="no colours in the live view (also when NO_COLOR is set)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sentinel.demo.hooks import DemoError
    from sentinel.demo.run import DemoOptions, run_demo

    options = DemoOptions(
        scenario_path=args.scenario,
        hosts=args.hosts,
        duration_s=args.duration,
        port=args.port,
        view=args.view,
        state_dir=args.state_dir,
        log_level=args.log_level,
        color=not args.no_color,
    )

    async def main() -> int:
        stop = asyncio.Event()
        task = asyncio.current_task()
        presses = 0

        def on_signal() -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                stop.set()
            elif task is not None:
                task.cancel()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
        try:
            result = await run_demo(options, stop=stop)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        return result.exit_code

    try:
        return asyncio.run(main())
    except (ScenarioError, DemoError) as exc:
        print(f"sentinel demo: {exc}", file=sys.stderr)
        return 2
    except asyncio.CancelledError:
        print("sentinel demo: stopped", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"sentinel demo: {exc.strerror or exc}", file=sys.stderr)
        return 2

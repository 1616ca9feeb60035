"""``sentinel aggregator run``: the cluster-side aggregator (systemd Type=notify).

Agents stream to ``GET /api/v1/stream``; the detectors turn what they send into verdicts (faulty, degraded,
stuck, straggler, host_silent), served at ``/api/v1/verdicts`` and as Prometheus metrics at ``/metrics``;
incidents (merged flight-recorder timelines of every agent involved) are kept in the state directory.
See docs/aggregator.md.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

from sentinel.aggregator.identity import TokenError, server_ssl_context
from sentinel.aggregator.loop import LoopErrorLimiter
from sentinel.aggregator.loop import run as run_loop
from sentinel.aggregator.server import AGGREGATOR_KEY, create_app, make_runner, make_site
from sentinel.aggregator.store import StoreError
from sentinel.config import ConfigError, load_aggregator_config
from sentinel.config.aggregator import AggregatorConfig
from sentinel.log import get_logger, setup_logging
from sentinel.systemd import SystemdNotifier
from sentinel.web import status_page_routes

DESCRIPTION = """sentinel aggregator run: the cluster-side aggregator (systemd Type=notify).

Agents stream to GET /api/v1/stream; the detectors turn what they send into verdicts (faulty, degraded,
stuck, straggler, host_silent), served at /api/v1/verdicts and as Prometheus metrics at /metrics;
incidents (merged flight-recorder timelines of every agent involved) are kept in the state directory.
See docs/aggregator.md.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "aggregator",
        help="run the cluster-side aggregator: ingest, detectors, verdicts, incidents, API",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="aggregator_command", metavar="SUBCOMMAND", required=True)
    run_p = sub.add_parser("run", help="run the aggregator daemon", description="run the aggregator daemon")
    run_p.add_argument(
        "--config",
        type=Path,
        help="aggregator TOML configuration (default /etc/sentinel/aggregator.toml if present, else defaults)",
    )
    run_p.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="override [log] level"
    )
    run_p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_aggregator_config(args.config)
    except ConfigError as exc:
        print(f"sentinel aggregator: {exc}", file=sys.stderr)
        return 2
    setup_logging("aggregator", args.log_level or config.log.level)
    try:
        return run_loop(serve(config, config_path=args.config))  # uvloop when installed
    except (TokenError, StoreError) as exc:  # a file it cannot use: one line naming it, no traceback
        print(f"sentinel aggregator: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"sentinel aggregator: cannot listen on {config.server.listen_host}:{config.server.listen_port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2


async def serve(config: AggregatorConfig, *, config_path: Path | None = None) -> int:
    """Run until SIGTERM/SIGINT; READY=1 once listening, WATCHDOG=1 from the detector loop.

    SIGHUP reads the configuration again (``config_path``, else the default path) and applies it without a
    restart; a bad file is refused with its error and the running configuration kept.
    """
    log = get_logger(module="aggregator.main")
    notifier = SystemdNotifier()
    last_ping = [0.0]

    def on_tick(_: float) -> None:
        if notifier.watchdog_s is not None:
            now = time.monotonic()
            if now - last_ping[0] >= notifier.watchdog_s / 3:
                last_ping[0] = now
                notifier.watchdog()

    ssl_context = server_ssl_context(config.server)
    app = create_app(config, on_tick=on_tick, extra_routes=status_page_routes(config.server.runbook_base_url))
    runner = make_runner(app, handle_signals=False, shutdown_timeout=5.0)
    limiter = LoopErrorLimiter(app[AGGREGATOR_KEY].metrics)
    limiter.install(asyncio.get_running_loop())
    await runner.setup()
    try:
        site = make_site(runner, ssl_context=ssl_context)
        await site.start()
        addresses = [f"{a[0]}:{a[1]}" for a in runner.addresses if isinstance(a, tuple)]
        log.info("aggregator_listening", addresses=addresses, state_dir=config.server.state_dir)
        notifier.ready(f"listening on {', '.join(addresses)}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        aggregator = app[AGGREGATOR_KEY]
        loop.add_signal_handler(
            signal.SIGHUP, lambda: aggregator.reload(lambda: load_aggregator_config(config_path))
        )
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 10.0)
            except TimeoutError:
                notifier.status(
                    f"{len(aggregator.by_host)} agents, {len(aggregator.engine.book.open)} open verdicts"
                )
        notifier.stopping()
        log.info("aggregator_stopping")
    finally:
        await runner.cleanup()
        limiter.uninstall(asyncio.get_running_loop())
        notifier.close()
    return 0

"""``sentinel fleet``: one view over several aggregators (one per cluster, or an HA pair).

``serve`` runs the merged read-only API (the aggregator's REST paths) with the status page, so the page and
``sentinel incident --api`` work across the fleet; ``verdicts`` prints the merged verdicts once. See
docs/deploy.md (fleet layout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from aiohttp import web

from sentinel.fleet import FleetReader, create_fleet_app

DESCRIPTION = """sentinel fleet serve|verdicts: one view over several aggregators.

Every --api URL (an aggregator's base URL, e.g. http://agg-a.c1:9400) is asked at once; the answers are
merged, tagged with each aggregator's cluster, and the copies an HA pair makes of one verdict are folded
into one. An aggregator that does not answer is named under "errors"; the rest is still answered.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fleet",
        help="one read-only view (API, status page, verdicts) over several aggregators",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="fleet_command", metavar="SUBCOMMAND", required=True)
    for name, text in (
        ("serve", "serve the merged API and the status page"),
        ("verdicts", "print the merged verdicts"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--api", action="append", required=True, metavar="URL", help="an aggregator's base URL (repeat)"
        )
        p.add_argument("--timeout", type=float, default=5.0, help="per-aggregator timeout in seconds")
        if name == "serve":
            p.add_argument("--listen", default="127.0.0.1:9500", help="HOST:PORT (default %(default)s)")
        else:
            p.add_argument("--state", choices=("open", "closed"), help="only open or closed verdicts")
            p.add_argument("--json", action="store_true", help="print the merged answer as JSON")
        p.set_defaults(func=run)


def _check_urls(urls: list[str]) -> str:
    for url in urls:
        if not url.startswith(("http://", "https://")):
            return f"--api {url}: not an http(s) URL"
    return ""


def run(args: argparse.Namespace) -> int:
    problem = _check_urls(args.api)
    if problem:
        print(f"sentinel fleet: {problem}", file=sys.stderr)
        return 2
    if args.fleet_command == "serve":
        host, _, port = args.listen.rpartition(":")
        if not host or not port.isdigit():
            print(f"sentinel fleet: --listen {args.listen}: expected HOST:PORT", file=sys.stderr)
            return 2
        try:
            asyncio.run(_serve(args.api, args.timeout, host, int(port)))
        except OSError as exc:
            print(f"sentinel fleet: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        return 0
    answer = asyncio.run(_verdicts(args.api, args.timeout, args.state))
    if args.json:
        print(json.dumps(answer, indent=1))
    else:
        for v in answer["verdicts"]:
            where = f"{v.get('host')}/{v.get('gpu')}" if v.get("gpu") is not None else str(v.get("host"))
            job = f" job {v['job']} rank {v.get('rank')}" if v.get("job") else ""
            print(
                f"{v['cluster']:<12} {v.get('state', ''):<6} {v.get('kind', ''):<11} {where:<24}{job} "
                f"{v.get('reason')} -> {v.get('action')} ({len(v['sources'])} source(s))"
            )
        for error in answer["errors"]:
            print(f"{error.get('kind', 'unreachable')}: {error['url']}: {error['error']}", file=sys.stderr)
    return 1 if answer["errors"] and not answer["verdicts"] else 0


async def _verdicts(urls: list[str], timeout: float, state: str | None) -> dict[str, Any]:
    async with FleetReader(urls, timeout_s=timeout) as reader:
        return await reader.verdicts(state)


async def _serve(urls: list[str], timeout: float, host: str, port: int) -> None:
    runner = web.AppRunner(create_fleet_app(urls, timeout_s=timeout), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"sentinel fleet: serving {len(urls)} aggregators on http://{host}:{port}/", file=sys.stderr)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()

"""``sentinel agent``: run the host agent, print one collection, or fetch a running agent's snapshot."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from sentinel.config import ConfigError, load_agent_config
from sentinel.config.agent import AgentConfig

DESCRIPTION = """Run the per-host agent: NVML metrics and events, Xid from NVML and the kernel log, NCCL/PyTorch
log classification, GPU → job/rank mapping, the flight-recorder probe socket, a ring buffer of recent
history, Prometheus /metrics, and a WebSocket stream to the aggregator. See docs/agent.md."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="run the per-host agent (NVML, Xid, logs, flight recorder) and stream to the aggregator",
        description=DESCRIPTION,
    )
    sub = parser.add_subparsers(dest="agent_command", metavar="SUBCOMMAND", required=True)

    run = sub.add_parser(
        "run", help="run the agent daemon (systemd: Type=notify)", description="run the agent daemon"
    )
    _config_option(run)
    run.add_argument(
        "--simulate",
        type=Path,
        metavar="SCENARIO.toml",
        help="watch the simulated GPUs of --host from this scenario instead of NVML (real time: scenario "
        "time 0 is the agent's start), for staging an aggregator, alerts and Slurm before GPUs arrive",
    )
    run.add_argument("--host", help="with --simulate: the scenario host to be (e.g. host-003)")
    run.set_defaults(func=_run)

    once = sub.add_parser(
        "once",
        help="collect once from the real GPUs and IB/RoCE ports and print it as JSON (debugging a host)",
        description="open NVML, read every GPU with the slow counters and every IB/RoCE port from sysfs, "
        "print one JSON object (inventory, samples, ib_ports, errors); exit 0 when any source was read, 2 "
        "when none was",
    )
    _config_option(once)
    once.add_argument("--json", action="store_true", help="print JSON (the only format; for scripts)")
    once.add_argument(
        "--sysfs-root",
        help="where sysfs is mounted, for the IB/RoCE ports (default: the config's ib.sysfs_root, /sys)",
    )
    once.add_argument(
        "--nvml-replay",
        type=Path,
        metavar="FILE.xml",
        help="answer NVML from a recorded `nvidia-smi -q -x` output instead of the driver (every component "
        'runs; docs/agent.md "Recorded GPUs") and add `health`, the host\'s judgement as `sentinel health '
        "--json` gives it",
    )
    once.set_defaults(func=_once)

    snap = sub.add_parser(
        "snapshot",
        help="print the ring-buffer snapshot of the running agent as one JSON document",
        description="fetch GET /api/v1/snapshot from the running agent's metrics/control port",
    )
    _config_option(snap)
    snap.add_argument("--url", help="agent base URL (default: from the config's [metrics] section)")
    snap.add_argument("--since", type=float, help="only entries at or after this unix time")
    snap.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the agent (default 10)"
    )
    snap.set_defaults(func=_snapshot)


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        help="agent TOML configuration (default /etc/sentinel/agent.toml if present, else built-in defaults)",
    )


def _load(args: argparse.Namespace) -> AgentConfig | None:
    try:
        return load_agent_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _state_dir_ready(config: AgentConfig) -> bool:
    try:
        Path(config.agent.state_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"error: agent.state_dir: cannot create {config.agent.state_dir}: {exc.strerror}", file=sys.stderr
        )
        return False
    return True


def _run(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    if args.simulate is not None:
        return _run_simulated(args, config)
    from sentinel.agent import Agent
    from sentinel.agent.nvml import NvmlSource
    from sentinel.log import setup_logging

    setup_logging("agent", config.log.level, host=config.agent.host or None)
    if not _state_dir_ready(config):
        return 2

    async def main() -> None:
        agent: Agent | None = None

        def on_error(function: str, error: str) -> None:
            if agent is not None:
                agent.sink.nvml_error(function, error)

        agent = Agent(config, NvmlSource(on_error=on_error))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.request_stop)
        await agent.run()

    asyncio.run(main())
    return 0


def _run_simulated(args: argparse.Namespace, config: AgentConfig) -> int:
    """The real agent on one simulated host of a scenario (the demo's SimHost), in real time."""
    import time
    from typing import cast

    from sentinel.agent import Agent
    from sentinel.agent.source import GpuSource
    from sentinel.log import setup_logging
    from sentinel.sim.host import SimCluster
    from sentinel.sim.scenario import ScenarioError, load_scenario

    if not args.host:
        print("error: --simulate needs --host NAME (a host of the scenario)", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.simulate)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = scenario.host_names()
    if args.host not in names:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        print(f"error: --host: {args.host!r} is not a host of {args.simulate} ({shown})", file=sys.stderr)
        return 2
    # the agent reports itself under the simulated host's name unless the configuration names it; the
    # machine's own NCCL RAS service and flight-recorder dump folder are not the simulated host's
    config = msgspec.structs.replace(
        config,
        agent=msgspec.structs.replace(config.agent, host=config.agent.host or args.host),
        nccl_ras=msgspec.structs.replace(config.nccl_ras, enabled=False),
        probe=msgspec.structs.replace(config.probe, fr_dump_dir=""),
    )
    setup_logging("agent", config.log.level, host=config.agent.host)
    if not _state_dir_ready(config):
        return 2

    async def main() -> None:
        sim = SimCluster(scenario, started_at=time.time(), clock=time.time)
        host = next(h for h in sim.hosts if h.name == args.host)
        agent = Agent(config, cast(GpuSource, host), host.inputs())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.request_stop)

        def host_down(name: str) -> None:  # the scenario takes this host down: its agent goes quiet
            if name == args.host:
                agent.request_stop()

        driver = asyncio.create_task(sim.drive(host_down), name="sim-driver")
        try:
            await agent.run()
        finally:
            sim.close()  # releases simulated NVML calls that hang by design
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver

    asyncio.run(main())
    return 0


def _once(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    if args.nvml_replay is not None:
        return _once_replayed(args, config)
    return _once_read(args, config, None)


def _once_replayed(args: argparse.Namespace, config: AgentConfig) -> int:
    """``agent once --nvml-replay``: the same reading with NVML answered by a recording, plus ``health``."""
    import time

    from sentinel.agent.nvml import NvmlSource
    from sentinel.agent.nvml.recording import RecordingError, load
    from sentinel.agent.nvml.replay import ReplayLibrary
    from sentinel.agent.one_tick import health_after_one_tick
    from sentinel.cli.cmd_health import json_document, judge

    try:
        library = ReplayLibrary(load(args.nvml_replay))
    except RecordingError as exc:
        print(f"error: --nvml-replay: {exc}", file=sys.stderr)
        return 2
    with library.installed(), _warnings_to_stderr(config):
        now = time.time()
        doc = health_after_one_tick(config, NvmlSource(), now)
        return _once_read(args, config, json_document(judge(doc, "node", {}), now))


@contextlib.contextmanager
def _warnings_to_stderr(config: AgentConfig) -> Iterator[None]:
    """The agent's own log, while it runs here, goes to stderr (stdout is the JSON) and says only what is
    wrong; the caller's logging is as it was afterwards."""
    import structlog

    from sentinel.log import setup_logging

    saved, bound = structlog.get_config(), structlog.contextvars.get_contextvars()
    setup_logging("agent", "warning", host=config.agent.host or None)
    try:
        yield
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**bound)


def _once_read(args: argparse.Namespace, config: AgentConfig, health: dict[str, Any] | None) -> int:
    import time

    from sentinel.agent.nvml import NvmlSource
    from sentinel.components.ib.record import contract_view
    from sentinel.components.ib.sysfs import SysfsPorts

    errors: list[str] = []
    read = 0
    now = time.time()
    inventory: list[Any] = []
    samples: list[Any] = []
    unsupported: list[str] = []
    source = NvmlSource(on_error=lambda fn, err: errors.append(f"nvml: {fn}: {err}"))
    try:
        inventory = source.open()
        read += 1
    except Exception as exc:
        errors.append(f"nvml: cannot initialise: {type(exc).__name__}: {exc}")
    else:
        for gpu in inventory:
            try:
                samples.append(source.read_slow(gpu.index, now))
            except Exception as exc:
                errors.append(f"nvml: GPU {gpu.index}: {type(exc).__name__}: {exc}")
        unsupported = sorted(f"{g}:{f}" for g, f in source.unsupported())
        source.close()
    root = args.sysfs_root or config.ib.sysfs_root
    scan = SysfsPorts(root, {g.pci_bus: g.index for g in inventory}).read()
    if scan.present:
        read += 1
    else:
        errors.append(f"ib: {Path(root) / 'class' / 'infiniband'}: not found (no IB/RoCE device)")
    errors.extend(f"ib: {problem}" for problem in scan.errors)
    out = {
        "inventory": msgspec.to_builtins(inventory),
        "samples": msgspec.to_builtins(samples),
        "unsupported": unsupported,
        "ib_ports": [contract_view(port) for port in scan.ports],
        "errors": errors,
    }
    if health is not None:
        out["health"] = health
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0 if read else 2


def _snapshot(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    base = args.url
    if not base:
        host = config.metrics.listen_host or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        base = f"http://{host}:{config.metrics.listen_port}"
    url = base.rstrip("/") + "/api/v1/snapshot"
    if args.since is not None:
        url += f"?since={args.since}"
    if not url.startswith(("http://", "https://")):
        print(f"error: --url: not an http(s) URL: {base}", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310 (scheme checked)
            body = response.read(512 * 1024 * 1024)
    except urllib.error.HTTPError as exc:
        print(f"error: {url}: HTTP {exc.code}: {exc.read(500).decode('utf-8', 'replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"error: {url}: agent not reachable: {reason}", file=sys.stderr)
        return 1
    try:
        document = json.loads(body)
    except ValueError:
        print(f"error: {url}: answer is not JSON", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(document) + "\n")
    return 0

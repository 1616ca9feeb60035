"""A 350,000-GPU fleet (15 clusters) by simulation: aggregators, their load, where state lives, and what a
cross-cluster query costs.

Jobs never span clusters, so the fleet is one aggregator pair per cluster and nothing is shared between
clusters. Three measurements, each of the real code:

1. one cluster's aggregator load: the engine (decode, ingest, detectors) fed one cluster's hosts at 1 Hz
   with two jobs of FR heads every 2 s (``bench/aggregator.py``'s job workload), CPU seconds per second;
2. one cluster's durable state: the state store's full snapshot of that cluster (verdicts, latched facts),
   its size on disk and the time to write it;
3. the cross-cluster read: ``--clusters`` real aggregators (``--ha``: two per cluster), each its own
   process on 127.0.0.1 holding its cluster's hosts and a few open verdicts, read merged two ways: through
   :class:`sentinel.fleet.FleetReader` here (the merge), and by HTTP GETs to ``sentinel fleet serve``'s app
   in another process (what the status page and ``sentinel incident --api`` pay): latency and bytes of a
   fleet-wide ``verdicts?state=open``, ``jobs``, ``incidents`` and ``hosts``.

    .venv/bin/python bench/fleet.py                    # 15 clusters, 350,000 GPUs, all three parts
    .venv/bin/python bench/fleet.py --only query --ha  # the cross-cluster read alone, 30 aggregators
    .venv/bin/python bench/fleet.py --only query --clusters 15 --gpus 70000   # the read at reduced scale
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sentinel.components.xid.parse import xid_record
from sentinel.wire import Event, XidOccurred

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GPUS = 8
TOKEN = "bench-fleet-token-0123456789"


def cluster_load(hosts: int, seconds: int) -> dict[str, Any]:
    from bench import aggregator as single

    return single.engine_jobs(hosts, seconds, 24576, 1.5, min(5.0, seconds / 4))


def populate(engine: Any, cluster: int, hosts: int, verdicts: int) -> None:
    from sentinel.wire import Batch, GpuInfo, GpuSample, Hello

    gpus = [
        GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{0x18 + g:02x}:00", name="H100") for g in range(GPUS)
    ]
    sample = [GpuSample(gpu=g, t=1.0, util_gpu_pct=98.0, temp_c=64.0, power_w=640.0) for g in range(GPUS)]
    now = time.time()
    for i in range(hosts):
        view = engine.hello(Hello(host=f"c{cluster:02d}-n{i:05d}", gpus=gpus, boot_id="b"), now)
        events: list[Event] = (
            [XidOccurred(t=1.0, gpu=i % GPUS, record=xid_record(79))]
            if i % max(1, hosts // verdicts) == 0
            else []
        )
        engine.ingest(view, Batch(seq=1, t=1.0, samples=sample, events=events), now)


def state_size(hosts: int) -> dict[str, Any]:
    """One cluster's full snapshot through the real store: bytes on disk and seconds to write."""
    from sentinel.aggregator.engine import Engine
    from sentinel.aggregator.latches import FleetLatches
    from sentinel.aggregator.store import StateStore

    engine = Engine()
    populate(engine, 0, hosts, 20)
    with tempfile.TemporaryDirectory(prefix="sentinel-fleet-") as tmp:
        store = StateStore(Path(tmp))
        store.register(engine.book, 0.0)
        store.register(FleetLatches(engine.fleet), 0.0)
        started = time.perf_counter()
        records = store.flush(full=True)
        collect_s = time.perf_counter() - started
        store.wait_idle(120)
        total_s = time.perf_counter() - started
        store.close()
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())
    return {"records": records, "bytes": size, "collect_s": round(collect_s, 3), "write_s": round(total_s, 3)}


def serve_cluster(cluster: int, replica: int, hosts: int, workdir: Path) -> None:
    """One cluster's aggregator in its own process: its hosts and verdicts, then its REST API on 127.0.0.1."""

    from sentinel.aggregator.server import AGGREGATOR_KEY, create_app
    from sentinel.config.aggregator import AggregatorConfig
    from sentinel.log import setup_logging

    setup_logging("bench", "warning")
    config = AggregatorConfig()
    config.fleet.cluster = f"c{cluster:02d}"
    config.state.enabled = False
    config.incidents.enabled = False
    # the simulated hosts report once and then fall silent: host_silent would open one verdict per host and
    # turn "the open verdicts" into a list of every host; the read is measured on 20 real ones per cluster
    config.detect.disabled = ["host_silent"]
    name = f"c{cluster:02d}-{replica}"

    app = create_app(config, tokens=[f"{TOKEN} c*"], state_dir=workdir / name)
    populate(app[AGGREGATOR_KEY].engine, cluster, hosts, 20)
    _serve_until_terminated(app, workdir / f"{name}.port")


def serve_fleet(urls: list[str], workdir: Path) -> None:
    """``sentinel fleet serve``'s app (create_fleet_app) in its own process, over every aggregator."""

    from sentinel.fleet import create_fleet_app
    from sentinel.log import setup_logging

    setup_logging("bench", "warning")

    _serve_until_terminated(create_fleet_app(urls, timeout_s=120), workdir / "fleet.port")


def _serve_until_terminated(app: Any, port_file: Path) -> None:
    """Serve ``app`` on 127.0.0.1 (an ephemeral port, written to ``port_file``) until SIGTERM."""
    from aiohttp import web

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port_file.write_text(str(runner.addresses[0][1]))
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, __file__, *args], env=env)


def _wait_port(path: Path, proc: subprocess.Popen[bytes], deadline: float) -> int:
    while not path.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{path.stem} did not start")
        time.sleep(0.1)
    return int(path.read_text())


async def _timed(call: Any, repeat: int) -> tuple[list[float], Any]:
    times = []
    answer: Any = None
    for _ in range(repeat):
        started = time.perf_counter()
        answer = await call()
        times.append(time.perf_counter() - started)
    return sorted(times), answer


async def cross_cluster(clusters: int, hosts: int, queries: int, ha: bool) -> dict[str, Any]:
    """Every aggregator (``ha``: two per cluster) in its own process with its cluster's hosts; the merged
    reads timed twice: :class:`FleetReader` in this process (the merge itself), and HTTP GETs to
    ``sentinel fleet serve``'s app in another process (what the status page and ``sentinel incident
    --api`` pay: the merge plus its JSON)."""
    import aiohttp
    import psutil

    from sentinel.fleet import FleetReader

    replicas = 2 if ha else 1
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="sentinel-fleet-") as tmp:
        workdir = Path(tmp)
        try:
            for c in range(clusters):
                for r in range(replicas):
                    procs.append(
                        _spawn("--serve-cluster", str(c), "--replica", str(r), "--hosts", str(hosts), "--workdir", tmp)
                    )  # fmt: skip
            deadline = time.time() + 900
            urls = []
            for i, proc in enumerate(procs):
                c, r = divmod(i, replicas)
                port = _wait_port(workdir / f"c{c:02d}-{r}.port", proc, deadline)
                urls.append(f"http://127.0.0.1:{port}")
            started = time.perf_counter()
            fleet = _spawn("--serve-fleet", ",".join(urls), "--workdir", tmp)
            procs.append(fleet)
            fleet_url = f"http://127.0.0.1:{_wait_port(workdir / 'fleet.port', fleet, deadline)}"
            out: dict[str, Any] = {
                "aggregators": len(urls),
                "aggregator_rss_mb_each": round(
                    max(psutil.Process(p.pid).memory_info().rss for p in procs[:-1]) / 2**20, 1
                ),
                "fleet_start_s": round(time.perf_counter() - started, 2),
            }
            async with FleetReader(urls, timeout_s=120) as reader:
                for name, call, repeat in (
                    ("verdicts_open", lambda: reader.verdicts("open"), queries),
                    ("hosts", reader.hosts, max(1, queries // 5)),
                ):
                    times, answer = await _timed(call, repeat)
                    items = answer.get("verdicts", answer.get("hosts", []))
                    out[f"reader_{name}"] = {
                        "items": len(items),
                        "errors": len(answer["errors"]),
                        "bytes": len(json.dumps(answer)),
                        "p50_s": round(times[len(times) // 2], 3),
                        "max_s": round(times[-1], 3),
                    }
            timeout = aiohttp.ClientTimeout(total=300)
            async with aiohttp.ClientSession(timeout=timeout) as session:

                async def get(path: str) -> bytes:
                    async with session.get(fleet_url + path) as response:
                        response.raise_for_status()
                        return await response.read()

                for name, path, repeat in (
                    ("verdicts_open", "/api/v1/verdicts?state=open", queries),
                    ("jobs", "/api/v1/jobs", queries),
                    ("incidents", "/api/v1/incidents", queries),
                    ("hosts", "/api/v1/hosts", max(1, queries // 5)),
                ):
                    times, body = await _timed(lambda path=path: get(path), repeat)
                    answer = json.loads(body)
                    out[f"http_{name}"] = {
                        "items": max((len(v) for v in answer.values() if isinstance(v, list)), default=0),
                        "errors": len(answer.get("errors", [])),
                        "bytes": len(body),
                        "p50_s": round(times[len(times) // 2], 3),
                        "max_s": round(times[-1], 3),
                    }
            return out
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=15)
    parser.add_argument("--gpus", type=int, default=350_000, help="GPUs in the whole fleet")
    parser.add_argument("--seconds", type=int, default=40, help="seconds of one cluster's load to time")
    parser.add_argument("--queries", type=int, default=10, help="fleet-wide verdict queries to time")
    parser.add_argument(
        "--ha", action="store_true", help="two aggregators per cluster (the HA pair) for the read"
    )
    parser.add_argument(
        "--only", choices=("load", "state", "query"), help="run one of the three measurements only"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--serve-cluster", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--replica", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--hosts", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--serve-fleet", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_cluster is not None:
        serve_cluster(args.serve_cluster, args.replica, args.hosts, args.workdir)
        return 0
    if args.serve_fleet:
        serve_fleet(args.serve_fleet.split(","), args.workdir)
        return 0
    from sentinel.log import setup_logging

    setup_logging("bench", "warning")
    hosts = math.ceil(args.gpus / GPUS / args.clusters)
    print(
        f"fleet: {args.gpus} GPUs in {args.clusters} clusters -> {hosts} hosts ({hosts * GPUS} GPUs) per cluster; "
        f"one aggregator pair per cluster: {2 * args.clusters} aggregators",
        flush=True,
    )
    results: dict[str, Any] = {"hosts_per_cluster": hosts}
    if args.only in (None, "load"):
        results["load"] = cluster_load(hosts, args.seconds)
    if args.only in (None, "state"):
        state = results["state"] = state_size(hosts)
        print(
            f"one cluster's durable state: {state['records']} records, {state['bytes'] / 2**20:.1f} MB on disk, "
            f"full snapshot collected in {state['collect_s']} s, written in {state['write_s']} s "
            f"(the write-behind writes only what changed: a few records per second)",
            flush=True,
        )
    if args.only in (None, "query"):
        query = results["query"] = asyncio.run(cross_cluster(args.clusters, hosts, args.queries, args.ha))
        print(
            f"cross-cluster reads: {query['aggregators']} aggregator processes on 127.0.0.1 "
            f"({hosts} hosts each, RSS {query['aggregator_rss_mb_each']} MB each)",
            flush=True,
        )
        for name, q in query.items():
            if isinstance(q, dict):
                via = "FleetReader (merge only)" if name.startswith("reader_") else "GET sentinel fleet serve"
                print(
                    f"  {via:<26} {name.split('_', 1)[1]:<14} {q['items']:>7} items {q['bytes'] / 2**20:>8.2f} MB "
                    f"p50 {q['p50_s'] * 1000:>7.0f} ms  max {q['max_s'] * 1000:>7.0f} ms  errors {q['errors']}",
                    flush=True,
                )
    print("figures taken on whatever machine ran this (shared machines inflate them); ratios hold better")
    if args.json:
        args.json.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

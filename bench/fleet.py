"""A 350,000-GPU fleet (15 clusters) by simulation: aggregators, their load, where state lives, and what a
cross-cluster query costs.

Jobs never span clusters, so the fleet is one aggregator pair per cluster and nothing is shared between
clusters. Three measurements, each of the real code:

1. one cluster's aggregator load: the engine (decode, ingest, detectors) fed one cluster's hosts at 1 Hz
   with two jobs of FR heads every 2 s (``bench/aggregator.py``'s job workload), CPU seconds per second;
2. one cluster's durable state: the state store's full snapshot of that cluster (verdicts, latched facts),
   its size on disk and the time to write it;
3. the cross-cluster read: ``--clusters`` real aggregators on 127.0.0.1, each holding its cluster's hosts
   and a few open verdicts, read through :class:`sentinel.fleet.FleetReader` (what ``sentinel fleet serve``
   answers the status page with): latency and bytes of a fleet-wide ``verdicts?state=open`` and ``hosts``.

    .venv/bin/python bench/fleet.py                    # 15 clusters, 350,000 GPUs
    .venv/bin/python bench/fleet.py --clusters 4 --gpus 32768 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

GPUS = 8
TOKEN = "bench-fleet-token-0123456789"


def cluster_load(hosts: int, seconds: int) -> dict[str, Any]:
    import aggregator as single  # bench/aggregator.py

    return single.engine_jobs(hosts, seconds, 24576, 1.5, min(5.0, seconds / 4))


def populate(engine: Any, cluster: int, hosts: int, verdicts: int) -> None:
    from sentinel.wire import Batch, Event, GpuInfo, GpuSample, Hello

    gpus = [
        GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{0x18 + g:02x}:00", name="H100") for g in range(GPUS)
    ]
    sample = [GpuSample(gpu=g, t=1.0, util_gpu_pct=98.0, temp_c=64.0, power_w=640.0) for g in range(GPUS)]
    now = time.time()
    for i in range(hosts):
        view = engine.hello(Hello(host=f"c{cluster:02d}-n{i:05d}", gpus=gpus, boot_id="b"), now)
        events = (
            [Event(t=1.0, kind="xid", gpu=i % GPUS, xid=79)] if i % max(1, hosts // verdicts) == 0 else []
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


async def cross_cluster(clusters: int, hosts: int, queries: int) -> dict[str, Any]:
    from aiohttp import web

    from sentinel.aggregator.server import AGGREGATOR_KEY, create_app
    from sentinel.config.aggregator import AggregatorConfig
    from sentinel.fleet import FleetReader

    runners = []
    urls = []
    with tempfile.TemporaryDirectory(prefix="sentinel-fleet-") as tmp:
        try:
            for c in range(clusters):
                config = AggregatorConfig()
                config.fleet.cluster = f"c{c:02d}"
                config.state.enabled = False
                config.incidents.enabled = False
                app = create_app(config, tokens=[f"{TOKEN} c*"], state_dir=Path(tmp) / str(c))
                populate(app[AGGREGATOR_KEY].engine, c, hosts, 20)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                runners.append(runner)
                urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
            out: dict[str, Any] = {}
            async with FleetReader(urls, timeout_s=120) as reader:
                for name, call in (
                    ("verdicts_open", lambda: reader.verdicts("open")),
                    ("hosts", reader.hosts),
                ):
                    times = []
                    answer: dict[str, Any] = {}
                    for _ in range(queries if name == "verdicts_open" else max(1, queries // 5)):
                        started = time.perf_counter()
                        answer = await call()
                        times.append(time.perf_counter() - started)
                    times.sort()
                    items = answer.get("verdicts", answer.get("hosts", []))
                    out[name] = {
                        "items": len(items),
                        "errors": len(answer["errors"]),
                        "bytes": len(json.dumps(answer)),
                        "p50_s": round(times[len(times) // 2], 3),
                        "max_s": round(times[-1], 3),
                    }
            return out
        finally:
            for runner in runners:
                await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=15)
    parser.add_argument("--gpus", type=int, default=350_000, help="GPUs in the whole fleet")
    parser.add_argument("--seconds", type=int, default=40, help="seconds of one cluster's load to time")
    parser.add_argument("--queries", type=int, default=10, help="fleet-wide verdict queries to time")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    from sentinel.log import setup_logging

    setup_logging("bench", "warning")
    hosts = math.ceil(args.gpus / GPUS / args.clusters)
    print(
        f"fleet: {args.gpus} GPUs in {args.clusters} clusters -> {hosts} hosts ({hosts * GPUS} GPUs) per cluster; "
        f"one aggregator pair per cluster: {2 * args.clusters} aggregators",
        flush=True,
    )
    load = cluster_load(hosts, args.seconds)
    state = state_size(hosts)
    print(
        f"one cluster's durable state: {state['records']} records, {state['bytes'] / 2**20:.1f} MB on disk, "
        f"full snapshot collected in {state['collect_s']} s, written in {state['write_s']} s "
        f"(the write-behind writes only what changed: a few records per second)",
        flush=True,
    )
    query = asyncio.run(cross_cluster(args.clusters, hosts, args.queries))
    for name, q in query.items():
        print(
            f"cross-cluster {name}: {args.clusters} aggregators, {q['items']} items, {q['bytes'] / 2**20:.2f} MB, "
            f"p50 {q['p50_s'] * 1000:.0f} ms, max {q['max_s'] * 1000:.0f} ms, errors {q['errors']}",
            flush=True,
        )
    print("figures taken on whatever machine ran this (shared machines inflate them); ratios hold better")
    if args.json:
        args.json.write_text(
            json.dumps({"hosts_per_cluster": hosts, "load": load, "state": state, "query": query})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

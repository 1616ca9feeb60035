"""Agent overhead: CPU per tick and RSS at 1 s ticks with 8 simulated GPUs, next to prometheus-node-exporter.

    .venv/bin/python bench/agent.py [--duration 60] [--gpus 8] [--tick 1.0]

The agent runs in its own process (``--child``) with a simple simulated 8-GPU source, its /metrics on a
free 127.0.0.1 port, and a real WebSocket stream to a small acking aggregator in this process. Both the agent
and prometheus-node-exporter (started on a free 127.0.0.1 port when installed) are scraped every second,
as Prometheus would. Figures per process: CPU seconds (user + system, from /proc/<pid>/stat) over the
measured window after a warm-up, and RSS at the end and at most; the load average is printed with them, as
a busy machine still adds some CPU time. RSS grows until the ring buffer holds its whole window
(ring.window_s, 900 s by default): ``--duration 930`` measures the steady state. The project's goal: under
0.3% of one core and under 40 MB RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:  # the measuring side's; the agent's process (--child) must not carry aiohttp's memory
    from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GOAL_CPU_PCT = 0.3
GOAL_RSS_MB = 40.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the agent side (child process) -------------------------------------------------------------------------


class SimpleSource:
    """A GpuSource with plausible, slowly varying readings; no faults."""

    def __init__(self, gpus: int) -> None:
        self.n = gpus
        self.t0 = time.time()

    def open(self) -> list:  # type: ignore[type-arg]
        from sentinel.wire import GpuInfo

        return [
            GpuInfo(
                index=i,
                uuid=f"GPU-bench-{i:04d}",
                pci_bus=f"0000:{0x18 + 16 * i:02x}:00",
                name="NVIDIA H100 80GB HBM3",
                driver="550.54.15",
                memory_total_bytes=80 << 30,
                nvlinks=18,
            )
            for i in range(self.n)
        ]

    def read_fast(self, gpu: int, now: float):  # type: ignore[no-untyped-def]
        from sentinel.wire import GpuSample

        phase = math.sin((now - self.t0) / 30 + gpu)
        return GpuSample(
            gpu=gpu,
            t=now,
            util_gpu_pct=90 + 5 * phase,
            util_mem_pct=40 + 5 * phase,
            mem_used_bytes=60 << 30,
            mem_total_bytes=80 << 30,
            temp_c=62 + 3 * phase,
            power_w=600 + 50 * phase,
            power_limit_w=700.0,
            sm_clock_mhz=1980.0,
            sm_clock_max_mhz=1980.0,
            mem_clock_mhz=2619.0,
            pstate=0,
            pcie_replay=0,
            pcie_tx_kbps=1000.0,
            pcie_rx_kbps=2000.0,
            pids=[100000 + gpu],
        )

    def read_slow(self, gpu: int, now: float):  # type: ignore[no-untyped-def]
        from sentinel.wire import ClockViolations, EccCounters, FabricInfo, NvLink, PcieLink, RowRemap

        sample = self.read_fast(gpu, now)
        sample.ecc = EccCounters(
            volatile_corrected=0, volatile_uncorrected=0, aggregate_corrected=3, aggregate_uncorrected=0
        )
        sample.remap = RowRemap(hist_max=640, hist_high=0, hist_partial=0, hist_low=0, hist_none=0)
        # every counter of every link as an H100 reports them, and the clock-policy violation time
        sample.nvlink = [
            NvLink(
                link=link,
                crc_errors=3,
                crc_data_errors=0 if link < 12 else None,
                replay_errors=1,
                recovery_errors=0,
            )
            for link in range(18)
        ]
        ref = int(now * 1e6)
        sample.violations = ClockViolations(
            reference_us=ref,
            power=ref * 300,
            thermal=0,
            sync_boost=0,
            board_limit=0,
            low_utilization=ref * 100,
            reliability=0,
            app_clocks=ref * 400,
            base_clocks=0,
        )
        # the Hopper/Blackwell fields (issue 11): fabric registration, PCIe link now vs max, HBM temp, recovery
        sample.pcie_link = PcieLink(gen=5, gen_max=5, width=16, width_max=16)
        sample.fabric = FabricInfo(
            state="completed", clique_id=1, cluster_uuid="00000000-0000-0000-0000-000000000001"
        )
        sample.mem_temp_c = 71.0
        sample.recovery_action = "none"
        return sample

    def wait_xid_events(self, timeout_s: float) -> list:  # type: ignore[type-arg]
        time.sleep(timeout_s)
        return []

    def close(self) -> None:
        pass


def fake_nvml_source(gpus: int) -> Any:
    """The real NVML source (nvidia-ml-py's marshalling, the batched field-values call, violation status)
    against the tests' fake libnvidia-ml (tests/agent/fakenvml.py): H100-like GPUs with 18 NVLinks each."""
    import pynvml

    from sentinel.agent.nvml import NvmlSource
    from tests.agent.fakenvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(index=i, nvlinks=dict.fromkeys(range(18), True)) for i in range(gpus)])
    pynvml.nvmlLib = fake.lib
    pynvml._nvmlGetFunctionPointer_cache = {}
    return NvmlSource()


def child(args: argparse.Namespace) -> int:
    import msgspec

    from sentinel.agent import Agent
    from sentinel.config.agent import AgentConfig
    from sentinel.log import setup_logging

    setup_logging("agent", "warning", host="bench-host")
    config = msgspec.convert(
        {
            "agent": {"host": "bench-host", "state_dir": args.state_dir},
            "collect": {"tick_s": args.tick, "slow_tick_s": 10.0},
            "kmsg": {"enabled": False},
            "probe": {"socket_path": str(Path(args.state_dir) / "probe.sock")},
            "metrics": {"listen_host": "127.0.0.1", "listen_port": args.metrics_port},
            "stream": {
                "aggregator_url": f"ws://127.0.0.1:{args.aggregator_port}/api/v1/stream",
                "token_file": "",
            },
            "systemd": {"notify": False},
        },
        AgentConfig,
    )

    async def main() -> None:
        import signal

        if args.source == "sim":
            from sentinel.sim.host import sim_hosts
            from sentinel.sim.scenario import parse_scenario

            scenario = parse_scenario(
                {
                    "seed": 1,
                    "duration_s": 100000,
                    "tick_s": args.tick,
                    "cluster": {"hosts": 1, "gpus_per_host": args.gpus},
                    "jobs": [{"id": "bench-job"}],
                }
            )
            cluster, hosts = sim_hosts(scenario, started_at=time.time(), clock=time.time)
            agent = Agent(config, hosts[0], hosts[0].inputs())
        elif args.source == "nvml":
            agent = Agent(config, fake_nvml_source(args.gpus))
        else:
            agent = Agent(config, SimpleSource(args.gpus))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, agent.request_stop)
        await agent.run()
        if args.source == "sim":
            cluster.close()

    asyncio.run(main())
    return 0


# -- the measuring side --------------------------------------------------------------------------------------


class AckingAggregator:
    def __init__(self) -> None:
        self.batches = 0

    async def stream(self, request: web.Request) -> web.StreamResponse:
        import aiohttp
        from aiohttp import web

        from sentinel.wire import Ack, Batch, decode_agent_frame, encode

        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                frame = decode_agent_frame(message.data)
                if isinstance(frame, Batch):
                    self.batches += 1
                    await ws.send_bytes(encode(Ack(seq=frame.seq)))
        return ws


class Measured:
    def __init__(self, name: str, proc: psutil.Process) -> None:
        self.name = name
        self.proc = proc
        self.cpu0 = 0.0
        self.t0 = 0.0
        self.rss_max = 0

    def cpu(self) -> float:
        """CPU seconds, user + system with reaped children's, from /proc/<pid>/stat (clock ticks)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        # after "pid (comm)": state is fields[0], utime/stime/cutime/cstime are stat fields 14..17
        return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self.cpu0, self.t0 = self.cpu(), time.monotonic()

    def sample_rss(self) -> None:
        self.rss_max = max(self.rss_max, self.proc.memory_info().rss)

    def report(self, ticks: float) -> dict[str, float]:
        cpu = self.cpu() - self.cpu0
        wall = time.monotonic() - self.t0
        return {
            "cpu_pct_of_one_core": 100 * cpu / wall,
            "cpu_ms_per_tick": 1000 * cpu / max(ticks, 1),
            "rss_mb": self.proc.memory_info().rss / 1e6,
            "rss_max_mb": self.rss_max / 1e6,
        }


async def measure(args: argparse.Namespace) -> int:
    import aiohttp
    from aiohttp import web

    state = tempfile.mkdtemp(prefix="sentinel-bench-")
    aggregator = AckingAggregator()
    app = web.Application()
    app.router.add_get("/api/v1/stream", aggregator.stream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    aggregator_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", aggregator_port).start()
    metrics_port = free_port()
    agent_proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--child",
            f"--state-dir={state}",
            f"--metrics-port={metrics_port}",
            f"--aggregator-port={aggregator_port}",
            f"--gpus={args.gpus}",
            f"--tick={args.tick}",
            f"--source={args.source}",
        ],
        cwd=REPO,
    )
    exporter_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    exporter_proc: subprocess.Popen[bytes] | None = None
    exporter_port = free_port()
    if exporter_bin:
        exporter_proc = subprocess.Popen(
            [exporter_bin, f"--web.listen-address=127.0.0.1:{exporter_port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    else:
        print(
            "prometheus-node-exporter not installed (apt-get install -y prometheus-node-exporter): agent only"
        )
    targets = {"agent": f"http://127.0.0.1:{metrics_port}/metrics"}
    if exporter_proc is not None:
        targets["node-exporter"] = f"http://127.0.0.1:{exporter_port}/metrics"
    measured = [Measured("agent", psutil.Process(agent_proc.pid))]
    if exporter_proc is not None:
        measured.append(Measured("node-exporter", psutil.Process(exporter_proc.pid)))
    scrape_bytes = dict.fromkeys(targets, 0)
    scrape_failures = dict.fromkeys(targets, 0)
    try:
        async with aiohttp.ClientSession() as session:

            async def scrape_all() -> None:
                for name, url in targets.items():
                    try:
                        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                            scrape_bytes[name] = len(await r.read())
                    except (aiohttp.ClientError, TimeoutError):
                        scrape_failures[name] += 1

            warmup = min(5.0, args.duration / 4)
            end_warmup = time.monotonic() + warmup
            while time.monotonic() < end_warmup:
                await scrape_all()
                await asyncio.sleep(1.0)
            if agent_proc.poll() is not None:  # a child that died measures as 0% CPU: say so instead
                print(f"the agent exited during the warm-up (status {agent_proc.returncode}): see above")
                return 1
            load0 = os.getloadavg()
            for m in measured:
                m.start()
            batches0 = aggregator.batches
            scrape_failures.update(dict.fromkeys(targets, 0))  # start-up races do not count
            t_end = time.monotonic() + args.duration
            while time.monotonic() < t_end:
                await scrape_all()
                for m in measured:
                    m.sample_rss()
                await asyncio.sleep(1.0)
            ticks = args.duration / args.tick
            load1 = os.getloadavg()
            print(
                f"duration {args.duration:.0f} s, tick {args.tick:g} s, {args.gpus} simulated GPUs "
                f"({args.source} source), "
                f"scraped every 1 s; batches acked by the test aggregator: {aggregator.batches - batches0}"
            )
            print(
                f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end ({os.cpu_count()} CPUs)"
            )
            print(
                f"{'process':<15}{'CPU % of 1 core':>17}{'CPU ms/tick':>13}{'RSS MB':>9}{'max RSS MB':>12}{'scrape B':>10}"
            )
            for m in measured:
                r = m.report(ticks)
                print(
                    f"{m.name:<15}{r['cpu_pct_of_one_core']:>17.3f}{r['cpu_ms_per_tick']:>13.3f}"
                    f"{r['rss_mb']:>9.1f}{r['rss_max_mb']:>12.1f}{scrape_bytes[m.name]:>10}"
                )
            reports = [m.report(ticks) for m in measured]
            agent_report = reports[0]
            ok = (
                agent_report["cpu_pct_of_one_core"] < GOAL_CPU_PCT
                and agent_report["rss_max_mb"] < GOAL_RSS_MB
            )
            figures = f"agent {agent_report['cpu_pct_of_one_core']:.2f}%, {agent_report['rss_max_mb']:.1f} MB"
            if len(reports) > 1:
                figures += (
                    f"; node_exporter {reports[1]['cpu_pct_of_one_core']:.2f}%,"
                    f" {reports[1]['rss_max_mb']:.1f} MB"
                )
            print(
                f"goal < {GOAL_CPU_PCT:g}% of a core, < {GOAL_RSS_MB:g} MB RSS: "
                f"{'met' if ok else 'not met'} ({figures})"
            )
            if any(scrape_failures.values()):
                print(f"scrape failures: {scrape_failures}")
    finally:
        agent_proc.terminate()
        try:
            agent_proc.wait(10)
        except subprocess.TimeoutExpired:
            agent_proc.kill()
        if exporter_proc is not None:
            exporter_proc.terminate()
            exporter_proc.wait(10)
        await runner.cleanup()
        shutil.rmtree(state, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds (default 60)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    parser.add_argument("--tick", type=float, default=1.0, help="agent tick in seconds (default 1)")
    parser.add_argument(
        "--source",
        choices=("simple", "sim", "nvml"),
        default="simple",
        help="simple: a fixed-readings GPU source with the real host collectors (probe socket, psutil job "
        "mapping); sim: the scenario simulator's host (sentinel.sim.host), whose model runs in the agent "
        "process; nvml: the real NVML source over the tests' fake libnvidia-ml at the ABI (18 NVLinks per GPU, "
        "field values and violation status as on a Hopper) (default simple)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--aggregator-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(measure(args))


if __name__ == "__main__":
    sys.exit(main())

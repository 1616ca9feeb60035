"""Aggregator load benchmark: how many hosts at 1 Hz x 8 GPUs one core sustains with ingest-to-verdict p99 < 1 s.

Three processes on 127.0.0.1: this driver; the aggregator (one thread, so at most one core; ``--pin`` pins
it); a load generator (``--pin``: on another core) that opens one WebSocket per simulated host and streams
1 Hz batches of 8 GPU samples, spread evenly over each second. Every second one random host reports an Xid 79 on one GPU (and a GPU reset a few
seconds later); ingest-to-verdict latency is the verdict's open time minus the time the generator stamped
on that batch. A level is sustained when the generator kept its rate, every batch was acked, and the p99 of
both the verdict latency and the ack latency is under 1 s.

``--coalesce N`` makes the generator behave as agents with ``stream.coalesce_ticks = N``: a host's first
tick, a tick with a fault event or with its heads due, and the Nth tick held go out at once, as one batch
carrying the held ticks' samples (each with its own time) before this tick's; other ticks are held. The rate
is judged on the ticks made, the acks on the batches sent, and the verdict latency from the Xid batch's stamp
(an event is never held).

    .venv/bin/python bench/aggregator.py                 # ramp 1024 .. 8192 hosts, 30 s each
    .venv/bin/python bench/aggregator.py --quick         # 256 and 1024 hosts, 10 s each
    .venv/bin/python bench/aggregator.py --hosts 6144 --duration 60
    .venv/bin/python bench/aggregator.py --jobs --hosts 1024 --duration 75   # the job workload, reduced
    .venv/bin/python bench/aggregator.py --jobs --hosts 6144 --coalesce 2    # two ticks a batch
    .venv/bin/python bench/aggregator.py --ingest 256 --duration 6           # decode + ingest per batch
    .venv/bin/python bench/aggregator.py --stream 512 --duration 4           # a batch's path after the kernel
    .venv/bin/python bench/aggregator.py --processes 2 --pin --duration 20   # 2 processes on one port vs 1

The full-scale measurement (a quiet machine, two free cores; ~6 minutes): ramps the host count with both
jobs up to 12,288 hosts (98,304 GPUs, two 49,152-rank jobs) and prints the largest sustained, the hardware
ingest-to-verdict p99, the time to the hang and to the 1.2x straggler verdicts and the aggregator's RSS and
CPU per level (with agents sending every tick, and with ``stream.coalesce_ticks = 2``):

    flock /tmp/sentinel-bench.lock .venv/bin/python bench/aggregator.py --jobs --pin \\
        --hosts 3072,6144,12288 --all --duration 60 --json bench-jobs.json
    flock /tmp/sentinel-bench.lock .venv/bin/python bench/aggregator.py --jobs --pin --coalesce 2 \\
        --hosts 3072,6144,12288 --all --duration 60 --json bench-jobs-coalesced.json

``--jobs`` adds the seeds' workload: two jobs of ``--job-ranks`` ranks (49,152: 6,144 hosts x 8 GPUs each;
half the level's GPUs each when it has fewer hosts) whose ranks send Flight Recorder heads every 2 s in their host's
batch (half the hosts each second). Steps take 1 s (0.8 s compute, 0.2 s allreduce on the world group).
``--warmup`` + 5 s into the run one rank of job 0 stops entering its next collective (a hang: every other
rank waits in it); from the warmup on one rank of job 1 computes ``--slowdown`` times longer (a straggler:
its peers wait for it inside the collective). Reported: time from the hang to the stuck verdict naming that
rank, time from the straggler's start to the straggler verdict naming it, and the aggregator's RSS.

``--processes N`` runs each level twice: one aggregator process (the reference), then N sharing the stream
port with SO_REUSEPORT (``server.reuse_port``), each a whole engine for the hosts the kernel hands it and
each answering this driver on a port of its own; per process it prints the CPU, the connections and batches
it took and its RSS. Hosts only: with no correlator a job's ranks would be split between the engines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from sentinel import rfc6455
from sentinel.aggregator.wsconn import unmask
from sentinel.components.xid.parse import xid_record
from sentinel.wire import GpuWasReset, XidOccurred

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOKEN = "bench-token-0123456789abcdef"
GPUS = 8
PIN = [False]


def pin(core: int) -> None:
    """Pin to one core (``--pin``): a clean measurement on a quiet machine; on a shared one, leave the
    scheduler free (the aggregator is one thread, so it never uses more than one core either way)."""
    cores = os.sched_getaffinity(0)
    if core >= 0 and len(cores) > 1 and core in cores:
        os.sched_setaffinity(0, {core})


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _publish(path: Path, text: str) -> None:
    """Write a file the driver polls for in one step (rename): it must never read it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- aggregator process ---------------------------------------------------------------------------------


def serve(workdir: Path, core: int, profile: Path | None = None, share_port: int | None = None) -> None:
    """One aggregator process; ``share_port`` (0: any free port): listen with SO_REUSEPORT (``server.reuse_port``)
    beside the other processes of ``--processes``, and answer this driver's HTTP on a port of its own (a request
    to the shared port reaches whichever process the kernel picks)."""
    pin(core)
    raise_nofile()
    from aiohttp import web

    from sentinel.aggregator.listener import AggregatorSite
    from sentinel.aggregator.loop import run as run_loop
    from sentinel.aggregator.server import create_app, make_site
    from sentinel.config.aggregator import AggregatorConfig, IncidentsConfig, LimitsConfig, ServerConfig
    from sentinel.log import setup_logging

    setup_logging("aggregator", "warning")
    config = AggregatorConfig(
        server=ServerConfig(
            listen_host="127.0.0.1",
            listen_port=share_port or 0,
            reuse_port=share_port is not None,
            state_dir=str(workdir),
        ),
        incidents=IncidentsConfig(enabled=False),
        limits=LimitsConfig(  # every simulated host connects from 127.0.0.1
            max_streams_per_peer=1 << 20, max_connections_per_peer=1 << 20
        ),
    )

    async def main() -> None:
        app = create_app(config, tokens=[TOKEN])
        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        site = make_site(runner, backlog=4096)
        await site.start()
        port = runner.addresses[0][1]
        if share_port is not None:
            await AggregatorSite(runner, "127.0.0.1", 0).start()
            (workdir / "admin").write_text(str(runner.addresses[1][1]))
        if os.environ.get("SENTINEL_BENCH_STALLS"):
            _watch_stalls(workdir / "stalls.txt")
        (workdir / "port").write_text(str(port))
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    profiler = None
    if profile is not None:  # --profile: where the aggregator's one core goes (pstats, read with -m pstats)
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_loop(main(), os.environ.get("SENTINEL_BENCH_LOOP", "auto"))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile))


def _watch_stalls(path: Path) -> None:
    """Debug aid (``SENTINEL_BENCH_STALLS=1``): a thread that, whenever the event loop has not run a 20-ms
    heartbeat for 150 ms, records the loop thread's stack every 50 ms while the stall lasts."""
    import collections
    import threading
    import traceback

    loop = asyncio.get_running_loop()
    main_id = threading.get_ident()
    beat = [time.monotonic()]

    def tick() -> None:
        beat[0] = time.monotonic()
        loop.call_later(0.02, tick)

    tick()

    def watch() -> None:
        seen: collections.Counter[str] = collections.Counter()
        while True:
            time.sleep(0.05)
            gap = time.monotonic() - beat[0]
            if gap < 0.15:
                continue
            frame = sys._current_frames().get(main_id)
            if frame is None:
                continue
            stack = "".join(traceback.format_stack(frame, limit=14)[-9:])
            seen[stack] += 1
            with path.open("a") as out:
                out.write(f"--- gap {gap:.2f}s at {time.time():.2f}\n{stack}")

    threading.Thread(target=watch, daemon=True).start()


# -- load generator process -----------------------------------------------------------------------------


def _masked(payload: bytes, key: bytes = b"\x5a\x17\xc3\x88") -> bytes:
    """A client frame as an agent's WebSocket sends it: binary, masked (the compiled XOR, as in the server)."""
    return rfc6455.frame(rfc6455.OP_BINARY, payload, key, unmask)


class _Client(asyncio.Protocol):
    """A minimal WebSocket client on a raw asyncio transport: the generator's cost per batch must stay far
    below the aggregator's, so one process can play thousands of agents. Client frames are masked with a
    key of the client's own, as an agent's WebSocket masks them (unmasking is part of the aggregator's
    cost; a zero key would let it skip that)."""

    def __init__(self, name: str, key: str, on_ack: Any) -> None:
        self.name = name
        self.key = key
        self.on_ack = on_ack
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.upgraded = asyncio.get_event_loop().create_future()
        self.closed = False
        self.mask = os.urandom(4)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        if not self.upgraded.done():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buf[:12])
            del buf[: end + 4]
            if b" 101" not in status:
                self.upgraded.set_exception(ConnectionError(status.decode(errors="replace")))
                return
            self.upgraded.set_result(True)
        while len(buf) >= 2:
            length = buf[1] & 0x7F
            head = 2
            if length == 126:
                if len(buf) < 4:
                    return
                length = int.from_bytes(buf[2:4], "big")
                head = 4
            elif length == 127:
                if len(buf) < 10:
                    return
                length = int.from_bytes(buf[2:10], "big")
                head = 10
            if len(buf) < head + length:
                return
            opcode = buf[0] & 0x0F
            payload = bytes(buf[head : head + length])
            del buf[: head + length]
            if opcode == 0x2:
                self.on_ack(self, payload)
            elif opcode == 0x8:
                self.closed = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionError("closed during handshake"))

    def send(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_masked(payload, self.mask))


class JobModel:
    """Heads of the bench's two synchronous data-parallel jobs, computed from the clock (cheap per rank).

    Job 0 hangs at ``hang_at``: rank ``hung`` never enters collective ``K`` (the step due then), every other
    rank enters it and waits. Job 1 has a straggler from ``straggle_at``: rank ``slow`` computes
    ``slowdown`` times longer, so every step takes longer and its peers wait inside the allreduce.
    """

    COMPUTE_S = 0.8
    COMM_S = 0.2

    def __init__(self, ranks: int, start: float, hang_at: float, straggle_at: float, slowdown: float) -> None:
        self.ranks = ranks
        self.start = start
        self.hang_at = hang_at
        self.straggle_at = straggle_at
        self.slowdown = slowdown
        self.hung = ranks // 2 + 3
        self.slow = ranks // 3 + 5
        step = self.COMPUTE_S + self.COMM_S
        self.hang_step = int((hang_at - start) / step) + 1  # the first collective the hung rank never enters
        self.straggle_step = int((straggle_at - start) / step) + 1
        self._steps: dict[tuple[bool, int, int], list[Any]] = {}

    def step_start(self, job: int, seq: int) -> float:
        """When step ``seq`` (its compute) begins."""
        step = self.COMPUTE_S + self.COMM_S
        if job == 1 and seq > self.straggle_step:
            slow_step = self.COMPUTE_S * self.slowdown + self.COMM_S
            return self.start + self.straggle_step * step + (seq - self.straggle_step) * slow_step
        return self.start + seq * step

    def heads(self, job: int, rank: int, gpu: int, now: float) -> Any:
        from sentinel.fr.heads import FrHeads, InFlight, PgHead, StepTime

        step = self.COMPUTE_S + self.COMM_S
        if job == 1 and now >= self.step_start(1, self.straggle_step):
            slow_step = self.COMPUTE_S * self.slowdown + self.COMM_S
            seq = self.straggle_step + int((now - self.step_start(1, self.straggle_step)) / slow_step)
        else:
            seq = int((now - self.start) / step)
        begun = self.step_start(job, seq)
        compute = self.COMPUTE_S
        if job == 1 and rank == self.slow and seq >= self.straggle_step:
            compute = self.COMPUTE_S * self.slowdown
        in_flight: list[Any] = []
        completed = seq - 1
        if job == 0 and seq >= self.hang_step:
            completed = self.hang_step - 1
            if rank != self.hung:  # everyone else entered collective hang_step and waits there
                entered = self.step_start(0, self.hang_step) + compute
                if now > entered:
                    in_flight = [
                        InFlight(seq=self.hang_step, op="allreduce", age_s=now - entered, state="started")
                    ]
        else:
            entered = begun + compute  # the straggler's peers enter early and wait for it
            if now >= entered:
                in_flight = [InFlight(seq=seq, op="allreduce", age_s=now - entered, state="started")]
        bucket = (rank * 2654435761 + completed) % 1000
        slow = job == 1 and rank == self.slow
        key = (slow, completed, bucket)
        steps = self._steps.get(key)
        if steps is None:  # ranks of one jitter bucket share their (frozen) step list: the generator's cost
            if len(self._steps) > 16384:
                self._steps.clear()
            jitter = bucket / 1000 * 0.02
            steps = self._steps[key] = [
                StepTime(
                    seq=s,
                    compute_s=(
                        self.COMPUTE_S * self.slowdown if slow and s >= self.straggle_step else self.COMPUTE_S
                    )
                    + jitter,
                )
                for s in range(max(0, completed - 7), completed + 1)
            ]
        pg = PgHead(
            pg_name="0",
            pg_desc="default_pg",
            last_enqueued_seq=completed + (1 if in_flight else 0),
            last_started_seq=completed + (1 if in_flight else 0),
            last_completed_seq=completed,
            in_flight=in_flight,
        )
        return FrHeads(
            rank=rank,
            t=now,
            job_id=f"bench-job-{job}",
            world_size=self.ranks,
            local_rank=gpu,
            pid=100000 + rank,
            gpu=gpu,
            pgs=[pg],
            steps=steps,
        )


def generate(
    url: str,
    hosts: int,
    duration: float,
    warmup: float,
    out: Path,
    core: int,
    job_ranks: int = 0,
    slowdown: float = 1.5,
    coalesce: int = 1,
) -> None:
    pin(core)
    raise_nofile()
    import base64
    import urllib.parse

    from msgspec.structs import replace

    from sentinel.wire import (
        Ack,
        Batch,
        Event,
        GpuInfo,
        GpuSample,
        Hello,
        ProcInfo,
        decode_aggregator_frame,
        encode,
    )

    parsed = urllib.parse.urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    stats: dict[str, Any] = {
        "sent": 0,
        "acked": 0,
        "connect_errors": 0,
        "ack_latency": [],
        "faults": [],
        "late_sends": 0,
        "heads": 0,
        "ticks": 0,
        "coalesce": coalesce,
    }
    samples = [
        GpuSample(
            gpu=g,
            t=0.0,
            util_gpu_pct=98.0 + g * 0.1,
            util_mem_pct=40.0,
            mem_used_bytes=70 * 1024**3,
            mem_total_bytes=80 * 1024**3,
            temp_c=64.0 + g * 0.3,
            power_w=640.0 + g,
            power_limit_w=700.0,
            sm_clock_mhz=1980.0 - g,
            sm_clock_max_mhz=1980.0,
            mem_clock_mhz=2619.0,
            pstate=0,
            pcie_replay=0,
        )
        for g in range(GPUS)
    ]
    sent_at: dict[tuple[str, int], float] = {}
    measure_from = [0.0]

    def on_ack(client: _Client, payload: bytes) -> None:
        frame = decode_aggregator_frame(payload)
        if isinstance(frame, Ack):
            t0 = sent_at.pop((client.name, frame.seq), None)
            if t0 is not None:
                stats["acked"] += 1
                if t0 >= measure_from[0]:
                    stats["ack_latency"].append(time.time() - t0)

    async def connect(i: int) -> _Client | None:
        name = f"bench-{i:05d}"
        loop = asyncio.get_running_loop()
        key = base64.b64encode(os.urandom(16)).decode()
        try:
            _, client = await loop.create_connection(lambda: _Client(name, key, on_ack), host, port)
            request = (
                f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Authorization: Bearer {TOKEN}\r\n\r\n"
            )
            assert client.transport is not None
            client.transport.write(request.encode())
            await asyncio.wait_for(client.upgraded, 60)
        except Exception:
            stats["connect_errors"] += 1
            return None
        gpus = [
            GpuInfo(index=g, uuid=f"GPU-{i:05d}-{g}", pci_bus=f"0000:{0x18 + g:02x}:00", name="H100")
            for g in range(GPUS)
        ]
        client.send(encode(Hello(host=name, gpus=gpus, boot_id="b")))
        return client

    async def main() -> None:
        clients: list[_Client | None] = []
        for chunk in range(0, hosts, 256):
            clients += await asyncio.gather(*(connect(i) for i in range(chunk, min(hosts, chunk + 256))))
        start = time.time() + 1.0
        stop = start + duration
        measure_from[0] = start + warmup
        _publish(out.parent / "load.start", str(start))
        model = (
            JobModel(job_ranks, start, start + warmup + 5.0, start + warmup, slowdown) if job_ranks else None
        )
        hosts_per_job = job_ranks // GPUS
        if model is not None:
            stats["jobs"] = {
                "ranks": job_ranks,
                "hung_rank": model.hung,
                "hang_at": model.hang_at,
                "slow_rank": model.slow,
                "straggle_at": model.straggle_at,
                "slowdown": slowdown,
            }
        # fault schedule: second k → (host index, gpu); the same GPU is reset 3 s later
        faults: dict[int, list[tuple[int, int, bool]]] = {}
        for k in range(int(warmup) + 1, int(duration) - 4):
            target, gpu = (k * 7919) % hosts, k % GPUS
            faults.setdefault(k, []).append((target, gpu, True))
            faults.setdefault(k + 3, []).append((target, gpu, False))
        seqs = [0] * hosts
        #: per host, the times of the routine ticks held (agents with stream.coalesce_ticks > 1)
        held: list[list[float]] = [[] for _ in range(hosts)]
        slot = 0.005  # send in 5 ms slices, hosts spread evenly over each second
        per_slice = hosts * slot
        tick = 0
        while True:
            slice_start = start + tick * slot
            if slice_start >= stop:
                break
            delay = slice_start - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.5:
                stats["late_sends"] += 1
            second = int(tick * slot)
            first = int((tick % int(1 / slot)) * per_slice)
            last = int(((tick % int(1 / slot)) + 1) * per_slice)
            due = {target: (gpu, bad) for target, gpu, bad in faults.get(second, [])}
            for i in range(first, min(last, hosts)):
                client = clients[i]
                if client is None or client.closed:
                    continue
                now = time.time()
                events: list[Event] = []
                if i in due:
                    gpu, bad = due[i]
                    if bad:
                        events.append(
                            XidOccurred(
                                t=now,
                                gpu=gpu,
                                text="NVRM: Xid 79 (bench)",
                                record=xid_record(79, "NVRM: Xid 79 (bench)"),
                            )
                        )
                        stats["faults"].append((client.name, gpu, now))
                    else:
                        events.append(GpuWasReset(t=now, gpu=gpu))
                stats["ticks"] += 1
                seq = seqs[i]
                job = i // hosts_per_job if model is not None and hosts_per_job else 2
                heads_due = (
                    model is not None and job < 2 and (second + i) % 2 == 0
                )  # every 2 s, half the hosts
                waiting = held[i]
                if not (events or heads_due or seq == 0 or len(waiting) + 1 >= coalesce):
                    waiting.append(now)  # routine: held for the next batch (the first tick is a slow one)
                    continue
                seqs[i] = seq + 1
                sent_at[(client.name, seq)] = now
                heads: list[Any] = []
                procs = None
                if model is not None and job < 2:
                    base_rank = (i - job * hosts_per_job) * GPUS
                    if seq == 0:  # the process map once: GPU -> job/rank (as the agent's job collector)
                        procs = [
                            ProcInfo(gpu=g, pid=100000 + base_rank + g, job_id=f"bench-job-{job}",
                                     rank=base_rank + g, local_rank=g, world_size=job_ranks)
                            for g in range(GPUS)
                        ]  # fmt: skip
                    if heads_due:
                        heads = [model.heads(job, base_rank + g, g, now) for g in range(GPUS)]
                        stats["heads"] += len(heads)
                batch_samples = samples
                if coalesce > 1:  # each tick's samples with its own time, the held ones first
                    batch_samples = [replace(s, t=t) for t in (*waiting, now) for s in samples]
                    waiting.clear()
                client.send(
                    encode(
                        Batch(seq=seq, t=now, samples=batch_samples, events=events, heads=heads, procs=procs)
                    )
                )
                stats["sent"] += 1
            tick += 1
        _publish(out.parent / "load.stop", str(time.time()))
        await asyncio.sleep(3.0)  # the last acks
        for client in clients:
            if client is not None and client.transport is not None and not client.closed:
                client.transport.write(b"\x88\x82\x00\x00\x00\x00\x03\xe8")  # close 1000, zero mask
        await asyncio.sleep(0.5)
        for client in clients:
            if client is not None and client.transport is not None:
                client.transport.close()

    asyncio.run(main())
    stats["ack_latency"] = [round(x, 4) for x in stats["ack_latency"]]
    out.write_text(json.dumps(stats))


# -- driver ---------------------------------------------------------------------------------------------


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def run_level(
    hosts: int,
    duration: float,
    warmup: float,
    job_ranks: int = 0,
    slowdown: float = 1.5,
    profile: Path | None = None,
    processes: int = 1,
    coalesce: int = 1,
) -> dict[str, Any]:
    import psutil

    with tempfile.TemporaryDirectory(prefix="sentinel-bench-") as tmp:
        workdir = Path(tmp)
        cores = sorted(os.sched_getaffinity(0))
        agg_cores = [cores[i % len(cores)] if PIN[0] else -1 for i in range(processes)]
        gen_core = cores[-1] if PIN[0] else -1
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        servers: list[subprocess.Popen[bytes]] = []
        gen: subprocess.Popen[bytes] | None = None

        def start_server(i: int, share_port: int | None) -> tuple[int, int]:
            """Aggregator process i: (its stream port, its own HTTP port)."""
            home = workdir / f"agg{i}"
            home.mkdir()
            server = subprocess.Popen(
                [
                    sys.executable, __file__, "--serve", str(home), "--core", str(agg_cores[i]),
                    *(["--profile", str(profile)] if profile is not None and i == 0 else []),
                    *(["--share-port", str(share_port)] if share_port is not None else []),
                ],
                env=env,
            )  # fmt: skip
            servers.append(server)
            deadline = time.time() + 30
            while not (home / "port").exists():
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("aggregator did not start")
                time.sleep(0.1)
            port = int((home / "port").read_text())
            admin = home / "admin"
            return port, int(admin.read_text()) if admin.exists() else port

        try:
            shared = processes > 1
            port, admin = start_server(0, 0 if shared else None)
            admins = [admin] + [start_server(i, port)[1] for i in range(1, processes)]
            bases = [f"http://127.0.0.1:{a}" for a in admins]
            procs = [psutil.Process(server.pid) for server in servers]
            out = workdir / "gen.json"
            gen = subprocess.Popen(
                [
                    sys.executable, __file__, "--generate", f"ws://127.0.0.1:{port}/api/v1/stream",
                    "--hosts", str(hosts), "--duration", str(duration), "--warmup", str(warmup),
                    "--out", str(out), "--core", str(gen_core),
                    "--job-ranks", str(job_ranks), "--slowdown", str(slowdown),
                    "--coalesce", str(coalesce),
                ],
                env=env,
            )  # fmt: skip
            gen_proc = psutil.Process(gen.pid)
            while not (workdir / "load.start").exists():
                if gen.poll() is not None:
                    raise RuntimeError("load generator failed")
                time.sleep(0.05)
            start = float((workdir / "load.start").read_text())
            time.sleep(max(0.0, start + warmup - time.time()))
            cpu0, gcpu0, t0 = [p.cpu_times() for p in procs], gen_proc.cpu_times(), time.time()
            loaded = [fetch(b + "/metrics").decode() for b in bases]  # every host connected, the warmup over
            applied0 = [_counter(m, "sentinel_ingest_batches_total") for m in loaded]
            while not (workdir / "load.stop").exists() and gen.poll() is None:
                time.sleep(0.05)
            cpu1, gcpu1, elapsed = [p.cpu_times() for p in procs], gen_proc.cpu_times(), time.time() - t0
            applied1 = [
                _counter(fetch(b + "/metrics").decode(), "sentinel_ingest_batches_total") for b in bases
            ]
            rss = [p.memory_info().rss for p in procs]
            if (workdir / "agg0" / "stalls.txt").exists():
                Path(os.environ["SENTINEL_BENCH_STALLS"]).write_text(
                    (workdir / "agg0" / "stalls.txt").read_text()
                )
            gen.wait(timeout=60)
            stats = json.loads(out.read_text())
            verdicts = [v for b in bases for v in json.loads(fetch(b + "/api/v1/verdicts"))["verdicts"]]
            metrics = [fetch(b + "/metrics").decode() for b in bases]
        finally:
            # a level that failed must not leave its generator streaming into the next one
            for child in (gen, *servers):
                if child is None or child.poll() is not None:
                    continue
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
    cpu = [a.user + a.system - b.user - b.system for a, b in zip(cpu1, cpu0, strict=True)]
    applied = [a - b for a, b in zip(applied1, applied0, strict=True)]
    each = [
        {
            "core": agg_cores[i],
            "cpu": round(cpu[i] / elapsed, 3),
            "batches": int(applied[i]),
            "connections": int(_counter(loaded[i], "sentinel_agents_connected")),
            "us_per_batch": round(cpu[i] / max(1.0, applied[i]) * 1e6, 1),
            "rss_mb": round(rss[i] / 2**20, 1),
        }
        for i in range(processes)
    ]
    latencies = []
    missed = 0
    for host, gpu, t_sent in stats["faults"]:
        hits = [
            v["opened_at"] - t_sent
            for v in verdicts
            if v["host"] == host
            and v["gpu"] == gpu
            and v["reason"] == "xid_79"
            and v["opened_at"] >= t_sent - 0.001
        ]
        if hits:
            latencies.append(min(hits))
        else:
            missed += 1
    tick_p99 = max(_histogram_quantile(m, "sentinel_aggregator_tick_duration_seconds", 0.99) for m in metrics)
    detector_p99 = {
        name: max(
            _histogram_quantile(
                m, "sentinel_aggregator_detector_duration_seconds", 0.99, f'detector="{name}"'
            )
            for m in metrics
        )
        for name in ("hardware", "stuck", "straggler", "inventory", "network", "host_silent")
    }
    # the generator kept its rate when it made every host's ticks; the batches those ticks called for (one
    # per tick, or fewer with --coalesce) scale with the ticks made, so sent/expected is ticks made/due
    ticks_expected = hosts * duration
    expected = stats["sent"] * ticks_expected / max(1, stats["ticks"])
    result = {
        "hosts": hosts,
        "gpus": hosts * GPUS,
        "duration_s": duration,
        "coalesce": coalesce,
        "ticks": stats["ticks"],
        "ticks_expected": int(ticks_expected),
        "batches_sent": stats["sent"],
        "batches_expected": int(expected),
        "batches_acked": stats["acked"],
        "connect_errors": stats["connect_errors"],
        "late_sends": stats["late_sends"],
        "ack_p50_s": percentile(stats["ack_latency"], 0.5),
        "ack_p99_s": percentile(stats["ack_latency"], 0.99),
        "verdict_n": len(latencies),
        "verdict_missed": missed,
        "verdict_p50_s": percentile(latencies, 0.5),
        "verdict_p99_s": percentile(latencies, 0.99),
        "verdict_max_s": max(latencies) if latencies else float("nan"),
        "tick_p99_s": tick_p99,
        "detector_p99_s": detector_p99,
        "aggregator_cpu": round(sum(cpu) / elapsed, 3),
        "aggregator_us_per_batch": round(sum(cpu) / max(1.0, sum(applied)) * 1e6, 1),
        "generator_cpu": round((gcpu1.user + gcpu1.system - gcpu0.user - gcpu0.system) / elapsed, 3),
        "generator_core": gen_core,
        "aggregator_rss_mb": round(max(rss) / 2**20, 1),
        "processes": each,
    }
    jobs = stats.get("jobs")
    if jobs:

        def named(kind: str, job: str, rank: int, since: float) -> tuple[list[float], int]:
            """Seconds from ``since`` to each verdict of ``kind`` naming (job, rank); other such verdicts."""
            right = [v for v in verdicts if v["kind"] == kind and v["job"] == job and v["rank"] == rank]
            wrong = sum(1 for v in verdicts if v["kind"] == kind) - len(right)
            return [v["opened_at"] - since for v in right], wrong

        hang, wrong_stuck = named("stuck", "bench-job-0", jobs["hung_rank"], jobs["hang_at"])
        slow, wrong_slow = named("straggler", "bench-job-1", jobs["slow_rank"], jobs["straggle_at"])
        result.update(
            job_ranks=jobs["ranks"],
            heads_sent=stats["heads"],
            hang_named_s=round(min(hang), 2) if hang else None,
            straggler_named_s=round(min(slow), 2) if slow else None,
            other_stuck_verdicts=wrong_stuck,
            other_straggler_verdicts=wrong_slow,
            slowdown=jobs["slowdown"],
        )
    result["sustained"] = bool(
        stats["connect_errors"] == 0
        and stats["ticks"] >= 0.98 * ticks_expected
        and stats["acked"] >= 0.99 * stats["sent"]
        and missed == 0
        and latencies
        and result["verdict_p99_s"] < 1.0
        and result["ack_p99_s"] < 1.0
        and result["aggregator_rss_mb"] < 1024
        and (
            not jobs
            or (
                result["hang_named_s"] is not None
                and result["hang_named_s"] <= 10.0
                and (duration - warmup < 60 or (result["straggler_named_s"] or 1e9) <= 60.0)
            )
        )
    )
    return result


def processes_level(hosts: int, duration: float, warmup: float, processes: int) -> dict[str, Any]:
    """One level on one process (the reference) and on ``processes`` processes sharing the port; prints both."""
    cores = sorted(os.sched_getaffinity(0))
    print(
        f"{hosts} hosts at 1 Hz, {duration:g} s: 1 aggregator process (reference), then {processes} sharing "
        f"one port (SO_REUSEPORT, no coordinator: hosts only, the job detectors would see split jobs); "
        f"cores available {cores}, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = {}
    for n in (1, processes):
        r = run_level(hosts, duration, warmup, processes=n)
        runs[n] = r
        gen_core = r["generator_core"]
        shares = [i for i, p in enumerate(r["processes"]) if gen_core >= 0 and p["core"] == gen_core]
        print(
            f"  {n} process{'es' if n > 1 else ''}: sent {r['batches_sent']}/{r['batches_expected']}, acked "
            f"{r['batches_acked']}, ack p50/p99 {r['ack_p50_s'] * 1000:.1f}/{r['ack_p99_s'] * 1000:.1f} ms, "
            f"hardware verdict p99 {r['verdict_p99_s'] * 1000:.1f} ms ({r['verdict_n']} faults, "
            f"{r['verdict_missed']} missed), generator CPU {r['generator_cpu']:.2f}"
            f"{f' on core {gen_core}' if gen_core >= 0 else ' (not pinned)'}"
            f"{f' shared with process {shares}' if shares else ''}; sustained: {'yes' if r['sustained'] else 'NO'}",
            flush=True,
        )
        for i, p in enumerate(r["processes"]):
            where = f" (core {p['core']})" if p["core"] >= 0 else ""
            print(
                f"    process {i}{where}: "
                f"CPU {p['cpu']:.2f}, {p['connections']} connections, {p['batches']} batches "
                f"({p['us_per_batch']:.1f} µs CPU each), RSS {p['rss_mb']:.0f} MB",
                flush=True,
            )
    return {"hosts": hosts, "reference": runs[1], "shared": runs[processes]}


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _histogram_quantile(text: str, name: str, q: float, label: str = "") -> float:
    """The upper bound of the bucket holding quantile ``q`` (``label``: only series containing it)."""
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket") and label in line:
            bound = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def engine_only(hosts: int, seconds: int) -> None:
    """The detection path without sockets: engine ingest and ticks for ``hosts`` x 8 GPUs at 1 Hz."""
    from sentinel.aggregator.engine import Engine
    from sentinel.wire import Batch, Event, GpuInfo, GpuSample, Hello, decode_agent_frame, encode

    engine = Engine()
    gpus = [
        GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{0x18 + g:02x}:00", name="H100") for g in range(GPUS)
    ]
    views = [engine.hello(Hello(host=f"bench-{i:05d}", gpus=gpus), 0.0) for i in range(hosts)]
    # frames are decoded from bytes, as the server does
    template = [
        GpuSample(gpu=g, t=0.0, util_gpu_pct=98.0, temp_c=64.0, power_w=640.0, sm_clock_mhz=1980.0 - g)
        for g in range(GPUS)
    ]
    ingest = tick = 0.0
    latencies = []
    for second in range(seconds):
        frames = []
        for i in range(hosts):
            events: list[Event] = (
                [XidOccurred(t=float(second), gpu=1, record=xid_record(79))] if i == second % hosts else []
            )
            frames.append(encode(Batch(seq=second, t=float(second), samples=template, events=events)))
        started = time.perf_counter()
        for view, frame in zip(views, frames, strict=True):
            batch = decode_agent_frame(frame)
            engine.ingest(view, batch, float(second))  # type: ignore[arg-type]
        ingest += time.perf_counter() - started
        started = time.perf_counter()
        engine.tick(float(second))
        tick_s = time.perf_counter() - started
        tick += tick_s
        latencies.append(tick_s)
    per_batch = ingest / (hosts * seconds) * 1e6
    print(
        f"engine only, {hosts} hosts x {GPUS} GPUs, {seconds} s: decode+ingest {per_batch:.1f} µs/batch, "
        f"tick mean {tick / seconds * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; "
        f"one core: {(hosts * per_batch / 1e6 + tick / seconds):.2f} s of CPU per second of fleet time"
    )


def _gpu_infos() -> list[Any]:
    from sentinel.wire import GpuInfo

    return [
        GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{0x18 + g:02x}:00", name="H100") for g in range(GPUS)
    ]


def _job_frames(hosts: int, seconds: int) -> list[list[bytes]]:
    """``--ingest`` and ``--stream``'s frames, second by second: each host's 8 samples, the process map in
    its first batch, and half the hosts' batches each second with the 8 heads of two jobs' ranks."""
    import msgspec

    from sentinel.wire import Batch, GpuSample, ProcInfo, encode

    template = [
        GpuSample(gpu=g, t=0.0, util_gpu_pct=98.0 + g * 0.1, util_mem_pct=40.0, temp_c=64.0 + g * 0.3,
                  power_w=640.0 + g, power_limit_w=700.0, sm_clock_mhz=1980.0 - g, sm_clock_max_mhz=1980.0,
                  pstate=0, pcie_replay=0)
        for g in range(GPUS)
    ]  # fmt: skip
    ranks = max(GPUS, hosts * GPUS // 2 // GPUS * GPUS)
    model = JobModel(ranks, 0.0, 1e9, 1e9, 1.0)
    per_job = ranks // GPUS
    frames: list[list[bytes]] = []
    for second in range(seconds):
        t = float(second)
        samples = [msgspec.structs.replace(sample, t=t) for sample in template]
        out = []
        for i in range(hosts):
            job = min(1, i // per_job)
            base = (i - job * per_job) * GPUS
            procs = (
                [ProcInfo(gpu=g, pid=100000 + base + g, job_id=f"bench-job-{job}", rank=base + g,
                          local_rank=g, world_size=ranks) for g in range(GPUS)]
                if second == 0
                else None
            )  # fmt: skip
            heads = (
                [model.heads(job, base + g, g, t + i / hosts) for g in range(GPUS)]
                if (second + i) % 2 == 0
                else []
            )
            out.append(encode(Batch(seq=second, t=t, samples=samples, heads=heads, procs=procs)))
        frames.append(out)
    return frames


def ingest_only(hosts: int, seconds: int, build_only: bool) -> None:
    """Decode and ingest the job workload's frames (half of each second's batches with 8 heads), no tick:
    the per-batch cost of the ingest path. Under ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``), the
    instructions of a run minus those of the same run with ``--build-only`` (frames built, nothing
    ingested) are the ingest path's, independent of the machine's load."""
    import gc

    from sentinel.aggregator.engine import Engine
    from sentinel.aggregator.tick_loop import _no_automatic_full_collections
    from sentinel.wire import Hello, decode_agent_frame

    engine = Engine()
    gpus = _gpu_infos()
    views = [engine.hello(Hello(host=f"bench-{i:05d}", gpus=gpus, boot_id="b"), 0.0) for i in range(hosts)]
    frames = _job_frames(hosts, seconds)
    if build_only:
        return
    gc.collect()
    gc.freeze()
    spent = 0.0
    with _no_automatic_full_collections(True):  # as the server's tick loop runs
        for second, out in enumerate(frames):
            t = float(second)
            started = time.process_time()
            for i, (view, frame) in enumerate(zip(views, out, strict=True)):
                engine.ingest(view, decode_agent_frame(frame), t + i / hosts)  # type: ignore[arg-type]
            spent += time.process_time() - started
            gc.freeze()
    print(
        f"decode + ingest, {hosts} hosts x {GPUS} GPUs, {seconds} s: {spent / (hosts * seconds) * 1e6:.1f} µs of CPU per batch"
    )


class _CountingTransport:
    """What an upgraded agent connection writes to, minus the kernel: bytes counted, nothing sent."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _Previous:
    """The protocol an AgentSocket replaced (aiohttp's request handler in the server)."""

    def connection_lost(self, exc: Exception | None) -> None:
        pass


def stream_path(hosts: int, seconds: int, build_only: bool) -> None:
    """The aggregator's whole per-batch path after the kernel, without ticks: each host's masked frames
    handed to its connection's ``AgentSocket.data_received`` (framing, unmasking, bounds, decode, ingest),
    and every batch acked through the durable store's group commit (one a second, the writer thread's SQLite
    commit included) onto a transport that counts the bytes. The job workload of ``--ingest``. Under
    ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``), minus the same run with ``--build-only``: the
    instructions one batch costs the aggregator between the socket's read and the ack's write."""
    import functools
    import gc

    from sentinel.aggregator.server import Aggregator
    from sentinel.aggregator.stream import Connection
    from sentinel.aggregator.tick_loop import _no_automatic_full_collections
    from sentinel.aggregator.wsconn import AgentSocket
    from sentinel.config.aggregator import AggregatorConfig, IncidentsConfig
    from sentinel.log import setup_logging
    from sentinel.wire import Hello, encode

    setup_logging("aggregator", "warning")
    gpus = _gpu_infos()
    hellos = [_masked(encode(Hello(host=f"bench-{i:05d}", gpus=gpus, boot_id="b"))) for i in range(hosts)]
    frames = [[_masked(frame) for frame in second] for second in _job_frames(hosts, seconds)]
    if build_only:
        return
    now = [0.0]
    config = AggregatorConfig(incidents=IncidentsConfig(enabled=False))

    async def main(state_dir: Path) -> tuple[float, int, int]:
        aggregator = Aggregator(
            config, tokens=[f"{TOKEN} bench-*"], clock=lambda: now[0], state_dir=state_dir
        )
        streams, acks = aggregator.streams, aggregator.acks
        grants = streams.grants_for(f"Bearer {TOKEN}")
        sockets: list[AgentSocket] = []
        transports: list[_CountingTransport] = []
        for _ in range(hosts):
            transport = _CountingTransport()
            conn = Connection(None, "127.0.0.1", grants)  # type: ignore[arg-type]
            conn.ws = AgentSocket(
                transport,  # type: ignore[arg-type]
                _Previous(),  # type: ignore[arg-type]
                max_message=config.limits.max_frame_bytes,
                write_limit=1 << 30,
                on_message=functools.partial(streams._on_message, conn),
                on_problem=functools.partial(streams._on_socket_problem, conn),
            )
            sockets.append(conn.ws)
            transports.append(transport)
        for socket_, hello in zip(sockets, hellos, strict=True):
            socket_.data_received(hello)
        gc.collect()
        gc.freeze()
        spent = 0.0
        with _no_automatic_full_collections(True):  # as the server's tick loop runs
            for second, out in enumerate(frames):
                started = time.process_time()
                for i, (socket_, frame) in enumerate(zip(sockets, out, strict=True)):
                    now[0] = second + i / hosts
                    socket_.data_received(frame)
                await acks.drain(30.0)  # one group commit: flushed, committed by the writer, acks written
                spent += time.process_time() - started
                gc.freeze()
        for socket_ in sockets:
            socket_.close()
        assert aggregator.store is not None
        aggregator.store.close()
        return spent, acks.sent, sum(t.written for t in transports)

    with tempfile.TemporaryDirectory(prefix="sentinel-bench-") as tmp:
        spent, acked, written = asyncio.run(main(Path(tmp)))
    batches = hosts * seconds
    print(
        f"stream path (frame, decode, ingest, durable ack), {hosts} hosts x {GPUS} GPUs, {seconds} s: "
        f"{spent / batches * 1e6:.1f} µs of CPU per batch; {acked}/{batches} acked, {written} bytes written"
    )


def engine_jobs(hosts: int, seconds: int, job_ranks: int, slowdown: float, warmup: float) -> dict[str, Any]:
    """The job workload through the engine without sockets: what one core spends per second of fleet time.

    Frames are built (not timed) and decoded + ingested + ticked (timed) second by second on a virtual
    clock, as the server would; the time to name the hang and the straggler is in that virtual time. This
    separates the aggregator's cost from the load generator's, which on a small shared machine competes for
    the same cores.
    """
    import gc

    import psutil

    from sentinel.aggregator.engine import Engine
    from sentinel.wire import Batch, GpuInfo, GpuSample, Hello, ProcInfo, decode_agent_frame, encode

    engine = Engine()
    gpus = [
        GpuInfo(index=g, uuid=f"GPU-{g}", pci_bus=f"0000:{0x18 + g:02x}:00", name="H100") for g in range(GPUS)
    ]
    views = [engine.hello(Hello(host=f"bench-{i:05d}", gpus=gpus, boot_id="b"), 0.0) for i in range(hosts)]
    template = [
        GpuSample(gpu=g, t=0.0, util_gpu_pct=98.0, temp_c=64.0, power_w=640.0, sm_clock_mhz=1980.0 - g)
        for g in range(GPUS)
    ]
    job_ranks = (
        min(job_ranks, hosts * GPUS // 2) // GPUS * GPUS
    )  # whole hosts: every rank of the world exists
    model = JobModel(job_ranks, 0.0, warmup + 5.0, warmup, slowdown)
    per_job = job_ranks // GPUS
    gc.collect()
    gc.freeze()
    busy: list[float] = []
    ticks: list[float] = []
    blocks: list[float] = []  # per tick, the longest step (what the event loop waits on at most)
    steps_run, step_started = False, 0.0
    hang_at = straggler_at = None
    rss0 = psutil.Process().memory_info().rss
    spent: dict[str, float] = {}
    longest_run: dict[str, float] = {}  # each detector's longest single step (what the loop waits on)
    for name, detector in engine.detectors.items():  # CPU per detector, as the engine's own metric measures

        def timed(seen: Any, _steps: Any = detector.evaluate_steps, _name: str = name) -> Any:
            steps = _steps(seen)
            while True:
                began = time.process_time()
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value
                finally:
                    took = time.process_time() - began
                    spent[_name] = spent.get(_name, 0.0) + took
                    longest_run[_name] = max(longest_run.get(_name, 0.0), took)
                yield

        detector.evaluate_steps = timed  # type: ignore[method-assign]
    from sentinel.aggregator.tick_loop import _no_automatic_full_collections

    with _no_automatic_full_collections(True):  # as the server's tick loop runs
        for second in range(seconds):
            t = float(second)
            frames = []
            for i in range(hosts):
                job = i // per_job if per_job else 2
                heads: list[Any] = []
                procs = None
                if job < 2:
                    base = (i - job * per_job) * GPUS
                    if second == 0:
                        procs = [
                            ProcInfo(gpu=g, pid=100000 + base + g, job_id=f"bench-job-{job}", rank=base + g,
                                     local_rank=g, world_size=job_ranks)
                            for g in range(GPUS)
                        ]  # fmt: skip
                    if (second + i) % 2 == 0:
                        heads = [model.heads(job, base + g, g, t + i / hosts) for g in range(GPUS)]
                frames.append(encode(Batch(seq=second, t=t, samples=template, heads=heads, procs=procs)))
            started = (
                time.process_time()
            )  # CPU time: on a shared machine wall time counts other people's work
            for i, (view, frame) in enumerate(zip(views, frames, strict=True)):
                engine.ingest(view, decode_agent_frame(frame), t + i / hosts)  # type: ignore[arg-type]
            tick_started = time.process_time()
            longest = 0.0
            for _ in engine.tick_stages(t + 1.0):  # as the server runs it: the loop is free between steps
                step_done = time.process_time()
                longest = max(longest, step_done - (step_started if steps_run else tick_started))
                step_started, steps_run = step_done, True
            steps_run = False
            done = time.process_time()
            busy.append(done - started)
            ticks.append(done - tick_started)
            blocks.append(longest)
            gc.freeze()  # every second, as the server's gc maintenance does (fleet.gc_freeze_interval_s)
            for v in engine.book.open.values():
                if hang_at is None and v.kind == "stuck" and v.job == "bench-job-0" and v.rank == model.hung:
                    hang_at = v.opened_at - model.hang_at
                if (
                    straggler_at is None
                    and v.kind == "straggler"
                    and v.job == "bench-job-1"
                    and v.rank == model.slow
                ):
                    straggler_at = v.opened_at - model.straggle_at
    others = [
        (v.kind, v.job, v.rank, v.host, v.gpu)
        for v in engine.book.all()
        if not (v.job == "bench-job-0" and v.rank == model.hung)
        and not (v.job == "bench-job-1" and v.rank == model.slow)
    ]
    steady = busy[int(warmup) :]
    result = {
        "hosts": hosts,
        "job_ranks": job_ranks,
        "cpu_per_s_mean": round(sum(steady) / len(steady), 3),
        "cpu_per_s_p99": round(percentile(steady, 0.99), 3),
        "tick_p99_s": round(percentile(ticks[int(warmup) :], 0.99), 3),
        "tick_step_p99_s": round(percentile(blocks[int(warmup) :], 0.99), 3),
        "hang_named_s": hang_at,
        "straggler_named_s": straggler_at,
        "false_verdicts": others[:5],
        "false_verdict_count": len(others),
        "rss_growth_mb": round((psutil.Process().memory_info().rss - rss0) / 2**20, 1),
        "detector_cpu_per_s": {name: round(v / seconds, 3) for name, v in sorted(spent.items())},
        "detector_longest_run_s": {name: round(v, 3) for name, v in sorted(longest_run.items())},
    }
    scrape_started = time.process_time()  # what one Prometheus scrape of this state costs the loop
    from prometheus_client import generate_latest

    from sentinel.aggregator.metrics import AggregatorMetrics

    scraped = AggregatorMetrics("default")
    scraped.attach(engine, lambda: hosts)
    generate_latest(scraped.registry)
    result["metrics_scrape_s"] = round(time.process_time() - scrape_started, 3)
    from sentinel.aggregator.store import BuiltinsHolder

    memory_started = time.process_time()  # the state store's snapshot of the detectors' memory, in one piece
    BuiltinsHolder("detectors", dict(engine.detectors)).snapshot(full=True)
    result["detector_memory_snapshot_s"] = round(time.process_time() - memory_started, 3)
    holder, longest_prepare = BuiltinsHolder("detectors", dict(engine.detectors)), 0.0
    prepare = holder.prepare()  # as the server takes it: prepared in steps ahead of the flush
    while True:
        began = time.process_time()
        done = next(prepare, StopIteration) is StopIteration
        longest_prepare = max(longest_prepare, time.process_time() - began)
        if done:
            break
    holder.snapshot()
    result["detector_memory_longest_step_s"] = round(longest_prepare, 3)
    print(
        f"engine only with jobs, {hosts} hosts x {GPUS} GPUs + 2 x {job_ranks} ranks, {seconds} s: "
        f"{result['cpu_per_s_mean']:.2f} s of CPU per second (p99 {result['cpu_per_s_p99']:.2f}, tick p99 "
        f"{result['tick_p99_s']:.2f} s, its longest step p99 {result['tick_step_p99_s']:.2f} s); hang named after {hang_at} s, {slowdown}x straggler after {straggler_at} s; "
        f"false verdicts {len(others)}; state grew {result['rss_growth_mb']} MB; detectors' CPU per second: "
        f"{result['detector_cpu_per_s']}; longest step: {result['detector_longest_run_s']}; one /metrics "
        f"scrape {result['metrics_scrape_s']} s; detector memory snapshot {result['detector_memory_snapshot_s']} s in one piece, longest step "
        f"{result['detector_memory_longest_step_s']} s prepared in steps",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", default="", help="comma list of host counts (default: a ramp up to 8192)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load per level (default 30)")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds ignored at the start of each level"
    )
    parser.add_argument("--quick", action="store_true", help="256 and 1024 hosts, 10 s each")
    parser.add_argument("--all", action="store_true", help="run every level even after one fails")
    parser.add_argument(
        "--pin", action="store_true", help="pin the aggregator and the generator to a core each"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--engine", action="store_true", help="also time the detection path without sockets")
    parser.add_argument(
        "--jobs", action="store_true", help="add two jobs of --job-ranks ranks with FR heads every 2 s"
    )
    parser.add_argument(
        "--job-ranks",
        type=int,
        default=49152,
        help="ranks per job with --jobs, at most half the level's GPUs each (default 49152)",
    )
    parser.add_argument(
        "--slowdown", type=float, default=1.2, help="the straggler's compute factor (default 1.2)"
    )
    parser.add_argument(
        "--profile", type=Path, help="cProfile the aggregator process; pstats of the last level written here"
    )
    parser.add_argument(
        "--ingest",
        type=int,
        metavar="HOSTS",
        help="decode and ingest HOSTS' batches for --duration s, no tick",
    )
    parser.add_argument(
        "--stream",
        type=int,
        metavar="HOSTS",
        help="the whole per-batch path after the kernel (frames, ingest, durable acks) for --duration s",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="with --ingest or --stream: build the frames only (callgrind's baseline)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="N aggregator processes sharing one port (SO_REUSEPORT, server.reuse_port), each a whole engine "
        "for the hosts the kernel gives it; each level also runs one process as the reference. Hosts only: "
        "no --jobs (default levels 3072,6144)",
    )
    parser.add_argument(
        "--coalesce",
        type=int,
        default=1,
        choices=range(1, 11),
        metavar="N",
        help="the generator behaves as agents with stream.coalesce_ticks = N: a host's batch goes out when "
        "its heads are due, with a fault event, or with N ticks in it (default 1: every tick)",
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--share-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--generate", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.core, args.profile, args.share_port)
        return 0
    if args.generate:
        generate(
            args.generate,
            int(args.hosts),
            args.duration,
            args.warmup,
            args.out,
            args.core,
            args.job_ranks,
            args.slowdown,
            args.coalesce,
        )
        return 0
    PIN[0] = args.pin
    if args.ingest:
        ingest_only(args.ingest, int(args.duration), args.build_only)
        return 0
    if args.stream:
        stream_path(args.stream, int(args.duration), args.build_only)
        return 0
    if args.engine and args.jobs:
        sizes = [int(x) for x in args.hosts.split(",") if x] or [6144]
        results = [
            engine_jobs(h, int(args.duration), args.job_ranks, args.slowdown, args.warmup) for h in sizes
        ]
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    if args.processes > 1:
        if args.coalesce != 1:
            parser.error("--processes runs every tick at once: no --coalesce")
        if args.jobs:
            parser.error("--processes is hosts only: with no correlator a job's ranks split between engines")
        levels = [int(x) for x in args.hosts.split(",") if x] or [3072, 6144]
        results = [
            processes_level(h, args.duration, min(args.warmup, args.duration / 3), args.processes)
            for h in levels
        ]
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    if args.engine:
        engine_only(6144, 10)
    if args.quick:
        levels, duration = [256, 1024], 10.0
    else:
        levels = [int(x) for x in args.hosts.split(",") if x] or [1024, 2048, 4096, 6144, 8192]
        duration = args.duration
    print(
        f"cores available: {sorted(os.sched_getaffinity(0))} "
        f"({'aggregator and generator pinned to a core each' if args.pin else 'not pinned'}); "
        f"load average before: {os.getloadavg()[0]:.1f}; agents' stream.coalesce_ticks = {args.coalesce}"
    )
    header = (
        f"{'hosts':>6} {'GPUs':>6} {'sent/exp':>13} {'acked':>7} {'ack p99':>9} {'verdict p50/p99/max (n)':>26} "
        f"{'tick p99':>8} {'agg CPU':>7} {'µs/batch':>8} {'gen CPU':>7} {'RSS MB':>7}  ok"
    )
    print(header)
    results = []
    best = 0
    for hosts in levels:
        ranks = min(args.job_ranks, hosts * GPUS // 2) // GPUS * GPUS if args.jobs else 0
        r = run_level(
            hosts,
            duration,
            min(args.warmup, duration / 3),
            ranks,
            args.slowdown,
            args.profile,
            coalesce=args.coalesce,
        )
        results.append(r)
        print(
            f"{r['hosts']:>6} {r['gpus']:>6} {r['batches_sent']:>6}/{r['batches_expected']:<6} {r['batches_acked']:>7} "
            f"{r['ack_p99_s'] * 1000:>7.1f}ms {r['verdict_p50_s'] * 1000:>5.1f}/{r['verdict_p99_s'] * 1000:.1f}/{r['verdict_max_s'] * 1000:.1f}ms "
            f"({r['verdict_n']:>2}) {r['tick_p99_s']:>7.3f}s {r['aggregator_cpu']:>7.2f} {r['aggregator_us_per_batch']:>8.1f} {r['generator_cpu']:>7.2f} {r['aggregator_rss_mb']:>7.1f}  "
            f"{'yes' if r['sustained'] else 'NO'}  (coalesce {r['coalesce']}, {r['ticks']}/{r['ticks_expected']} ticks)",
            flush=True,
        )
        print(
            "       detector run p99 (bucket bound): "
            + ", ".join(f"{k} {v:g} s" for k, v in r["detector_p99_s"].items()),
            flush=True,
        )
        if "job_ranks" in r:
            print(
                f"       jobs: 2 x {r['job_ranks']} ranks, {r['heads_sent']} heads sent; hang named after "
                f"{r['hang_named_s']} s (goal 10), straggler ({r['slowdown']}x) after {r['straggler_named_s']} s "
                f"(goal 60); other stuck/straggler verdicts: {r['other_stuck_verdicts']}/{r['other_straggler_verdicts']}",
                flush=True,
            )
        if r["sustained"]:
            best = max(best, hosts)
        elif not args.all:
            break
    print(
        f"largest sustained: {best} hosts ({best * GPUS} GPUs) at 1 Hz"
        f"{' with the two jobs' if args.jobs else ''}, ingest-to-verdict p99 < 1 s, RSS < 1 GiB (goal 12288)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bounded attack round on a real aggregator (and the agent's probe socket) on 127.0.0.1.

    flock /tmp/sentinel-bench.lock .venv/bin/python bench/attack.py [--scale 1.0]

Starts ``sentinel aggregator run`` as a child process with a config of tight limits, then replays the
attacks of issue 13 one after the other, each bounded in count and time, and prints one row per attack: what
was tried, what the aggregator did, and the child's RSS before and after (psutil). The probe flood runs against
a ProbeServer in a second child. Everything listens on 127.0.0.1 port 0; nothing is left running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel.fr.heads import MAX_IN_FLIGHT, MAX_PG_RANKS, FrHeads, InFlight, PgHead
from sentinel.wire import Batch, GpuInfo, GpuSample, Hello, ProcInfo, encode

TOKEN_A = "attack-token-rack-a-0123456789"
TOKEN_B = "attack-token-rack-b-0123456789"
TOKEN_FAKE = "attack-token-fake-0123456789"
READ_TOKEN = "attack-read-token-0123456789"

CONFIG = """
[server]
listen_host = "127.0.0.1"
listen_port = 0
tokens_file = "{dir}/tokens"
api_token_file = "{dir}/api-tokens"
state_dir = "{dir}/state"
api_page_size = 500

[limits]
max_hosts = 1000
max_streams_per_peer = 200
max_connections_per_peer = 400
header_timeout_s = 2.0
hello_timeout_s = 2.0

[fleet]
host_forget_after_s = 90.0

[log]
level = "warning"
"""


def _sorted_codes(codes: list[int | None]) -> list[int | None]:
    """The distinct close codes seen, None (the stream ended without a close frame) first."""
    return sorted(set(codes), key=lambda c: -1 if c is None else c)


class Row:
    def __init__(self, name: str, tried: str) -> None:
        self.name, self.tried = name, tried
        self.result = ""
        self.rss_before = self.rss_after = 0.0
        self.seconds = 0.0


def rss_mb(proc: psutil.Process) -> float:
    return float(proc.memory_info().rss) / 1e6


def gpus(n: int = 8, host: str = "h") -> list[GpuInfo]:
    return [GpuInfo(index=i, uuid=f"GPU-{host}-{i}", pci_bus=f"0000:{0x18 + i:02x}:00") for i in range(n)]


def sample(gpu: int, t: float, temp: float = 60.0) -> GpuSample:
    return GpuSample(gpu=gpu, t=t, temp_c=temp, util_gpu_pct=90.0, sm_clock_mhz=1980.0, power_w=600.0)


class Attacker:
    def __init__(self, url: str, proc: psutil.Process, log_path: Path) -> None:
        self.log_path = log_path
        self.url = url
        self.stream = url.replace("http://", "ws://") + "/api/v1/stream"
        self.proc = proc
        self.session: aiohttp.ClientSession | None = None

    async def ws(
        self, token: str, host: str | None = None, boot: str = "boot-1"
    ) -> aiohttp.ClientWebSocketResponse:
        assert self.session is not None
        ws = await self.session.ws_connect(
            self.stream, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0
        )
        if host is not None:
            await ws.send_bytes(encode(Hello(host=host, boot_id=boot, gpus=gpus(8, host))))
        return ws

    async def close_code(self, ws: aiohttp.ClientWebSocketResponse, timeout: float = 10.0) -> int | None:
        while True:
            msg = await ws.receive(timeout=timeout)
            if msg.type != aiohttp.WSMsgType.BINARY:
                return ws.close_code

    async def ack(self, ws: aiohttp.ClientWebSocketResponse) -> int:
        while True:  # commands (incident snapshots) may come in between: left unanswered
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.BINARY, msg
            frame = msgspec.msgpack.decode(msg.data)
            if frame.get("type") == "ack":
                return int(frame["seq"])

    def log_lines(self) -> int:
        """Lines the aggregator logged about refusals so far (verdict lines of the fake hosts not counted)."""
        events = (b'"stream_unauthorized"', b'"connection_refused"', b'"connections_refused"',
                  b'"stream_closed"', b'"stream_refused"', b'"loop_error"')  # fmt: skip
        return sum(1 for line in self.log_path.read_bytes().splitlines() if any(e in line for e in events))

    async def api(self, path: str, token: str | None = READ_TOKEN) -> tuple[int, Any, int, float]:
        assert self.session is not None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        started = time.perf_counter()
        async with self.session.get(self.url + path, headers=headers) as resp:
            body = await resp.read()
        elapsed = time.perf_counter() - started
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        return resp.status, doc, len(body), elapsed

    async def run(self, rows: list[Row], scale: float) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as self.session:
            real = await self.ws(TOKEN_B, "rack-b-01")
            seq = 0
            await real.send_bytes(
                encode(Batch(seq=seq, t=time.time(), samples=[sample(i, time.time()) for i in range(8)]))
            )
            await self.ack(real)

            async def steady() -> float:
                """The real agent's ack latency: is ingest still served?"""
                nonlocal seq
                seq += 1
                started = time.perf_counter()
                await real.send_bytes(
                    encode(Batch(seq=seq, t=time.time(), samples=[sample(i, time.time()) for i in range(8)]))
                )
                await self.ack(real)
                return time.perf_counter() - started

            async def attack(name: str, tried: str, body: Callable[[], Awaitable[str]]) -> None:
                row = Row(name, tried)
                row.rss_before = rss_mb(self.proc)
                started = time.perf_counter()
                try:
                    row.result = await asyncio.wait_for(body(), 120)
                except Exception as exc:
                    row.result = f"ATTACK SCRIPT ERROR {type(exc).__name__}: {exc}"[:200]
                row.seconds = time.perf_counter() - started
                ack = await steady()
                row.result += f"; real agent ack {ack * 1000:.0f} ms"
                row.rss_after = rss_mb(self.proc)
                rows.append(row)
                print(f"{name}: {row.result}", flush=True)

            async def takeover() -> str:
                ws = await self.ws(TOKEN_A, None)
                await ws.send_bytes(encode(Hello(host="rack-b-01", boot_id="forged", gpus=gpus(8))))
                await ws.send_bytes(encode(Batch(seq=10**12, t=time.time())))
                code = await self.close_code(ws)
                _status, doc, _, _ = await self.api("/api/v1/hosts")
                host = next(h for h in doc["hosts"] if h["name"] == "rack-b-01")
                return (
                    f"close {code}; rack-b-01 still connected={host['connected']}, batches={host['batches']}"
                )

            async def huge_ranks() -> str:
                ws = await self.ws(TOKEN_A, "rack-a-01")
                frame = {"type": "batch", "seq": 0, "t": time.time(),
                         "heads": [{"rank": r, "t": time.time(), "job_id": "j", "pgs": [{"pg_name": "0", "ranks": list(range(MAX_PG_RANKS + 1))}]} for r in range(4)]}  # fmt: skip
                await ws.send_bytes(msgspec.msgpack.encode(frame))
                over = await self.close_code(ws)
                codes = []
                for round_ in range(int(20 * scale)):  # within the list cap: the per-batch items limit
                    ws = await self.ws(TOKEN_A, "rack-a-01")
                    heads = [FrHeads(rank=r, t=time.time(), job_id=f"j{round_}",
                                     pgs=[PgHead(pg_name="0", ranks=list(range(MAX_PG_RANKS)))]) for r in range(16)]  # fmt: skip
                    await ws.send_bytes(encode(Batch(seq=round_ + 1, t=time.time(), heads=heads)))
                    codes.append(await self.close_code(ws))
                return f"ranks list over the cap: close {over}; {len(codes)} batches of 16 x 32768-rank lists: closes {_sorted_codes(codes)}"

            async def procs_flood() -> str:
                ws = await self.ws(TOKEN_A, "rack-a-02")
                procs = [ProcInfo(gpu=0, pid=i, job_id="x", rank=i) for i in range(240_000)]
                data = encode(Batch(seq=0, t=time.time(), procs=procs))
                await ws.send_bytes(data)
                return f"{len(data) / 1e6:.1f} MB frame of 240k procs: close {await self.close_code(ws)}"

            async def stuck_cost() -> str:
                ws = await self.ws(TOKEN_A, "rack-a-03")
                flights = [
                    InFlight(seq=100 + i, op="allreduce", age_s=60.0, state="started")
                    for i in range(MAX_IN_FLIGHT)
                ]
                heads = FrHeads(rank=0, t=time.time(), job_id="huge-world", world_size=131072,
                                pgs=[PgHead(pg_name="0", pg_desc="default_pg", last_enqueued_seq=99 + MAX_IN_FLIGHT,
                                            last_completed_seq=99, in_flight=flights)])  # fmt: skip
                for i in range(10):
                    await ws.send_bytes(encode(Batch(seq=i, t=time.time(), heads=[heads])))
                    await self.ack(ws)
                    await asyncio.sleep(0.5)
                _, _, _, _ = await self.api("/api/v1/jobs")
                text = await (await self.session.get(self.url + "/metrics")).text()  # type: ignore[union-attr]
                worst = 0.0
                for line in text.splitlines():
                    if (
                        line.startswith("sentinel_aggregator_detector_duration_seconds_sum{")
                        and 'detector="stuck"' in line
                    ):
                        worst = float(line.rsplit(" ", 1)[1])
                    if (
                        line.startswith("sentinel_aggregator_detector_duration_seconds_count{")
                        and 'detector="stuck"' in line
                    ):
                        count = float(line.rsplit(" ", 1)[1])
                await ws.close()
                return f"world 131072 x {MAX_IN_FLIGHT} in flight for 5 s: stuck detector mean {worst / max(count, 1) * 1000:.1f} ms per run"

            async def fake_hosts() -> str:
                n = int(3000 * scale)
                refused = 0
                for i in range(n):
                    ws = await self.ws(TOKEN_FAKE, f"fake-{i:05d}")
                    await ws.send_bytes(encode(Batch(seq=0, t=time.time(), samples=[sample(0, time.time())])))
                    msg = await ws.receive(timeout=10)
                    refused += msg.type != aiohttp.WSMsgType.BINARY
                    await ws.close()
                await asyncio.sleep(11)  # past host_silent_after_s: the fakes may be evicted for real hosts
                ws = await self.ws(TOKEN_A, "rack-a-new")
                await ws.send_bytes(encode(Batch(seq=0, t=time.time())))
                msg = await ws.receive(timeout=10)
                await ws.close()
                _, doc, _, _ = await self.api("/api/v1/hosts?limit=1")
                return (f"{n} fake names ({refused} refused at max_hosts=1000); tracked {doc['total']}; "
                        f"a new real host afterwards: {'admitted' if msg.type == aiohttp.WSMsgType.BINARY else 'REFUSED'}")  # fmt: skip

            async def retention() -> str:
                deadline = time.monotonic() + 150
                fakes = total = -1
                while time.monotonic() < deadline:
                    names: list[str] = []
                    offset: Any = 0
                    while offset is not None:
                        _, doc, _, _ = await self.api(f"/api/v1/hosts?offset={offset}")
                        names += [h["name"] for h in doc["hosts"]]
                        offset = doc["next_offset"]
                    total, fakes = len(names), sum(n.startswith("fake-") for n in names)
                    if fakes == 0:
                        break
                    await asyncio.sleep(2)
                return f"after host_forget_after_s (90 s): {total} hosts tracked, {fakes} of them fake"

            async def tcp_flood() -> str:
                port = int(self.url.rsplit(":", 1)[1])
                lines = self.log_lines()
                held, refused = [], 0
                for _ in range(
                    int(1500 * scale)
                ):  # from 127.0.0.2: the real agent (127.0.0.1) is another peer
                    r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                    held.append((r, w))
                await asyncio.sleep(0.5)
                for r, _ in held:
                    with contextlib_suppress():
                        try:
                            refused += await asyncio.wait_for(r.read(1), 0.01) == b""
                        except ConnectionResetError:  # closed at accept: reset, nothing read
                            refused += 1
                ws = await self.ws(TOKEN_A, "rack-a-tcp")  # a new agent from 127.0.0.1 during the flood
                await ws.send_bytes(encode(Batch(seq=0, t=time.time())))
                acked = await self.ack(ws) == 0
                await ws.close()
                for _, w in held:
                    w.close()
                text = await (await self.session.get(self.url + "/metrics")).text()  # type: ignore[union-attr]
                at_accept = next((line.rsplit(" ", 1)[1] for line in text.splitlines()
                                  if line.startswith("sentinel_ingest_rejected_total{") and "peer_connection_limit" in line), "0")  # fmt: skip
                return (f"{len(held)} idle sockets from 127.0.0.2: {refused} closed (at accept, or after header_timeout_s), "
                        f"{len(held) - refused} still open; {at_accept} refused at accept (limit 400); a new agent from 127.0.0.1 {'acked' if acked else 'NOT ACKED'}; "
                        f"{self.log_lines() - lines} refusal log lines")  # fmt: skip

            async def refusal_flood() -> str:
                lines = self.log_lines()
                statuses: dict[int, int] = {}
                assert self.session is not None
                for _ in range(int(3000 * scale)):
                    async with self.session.get(
                        self.stream, headers={"Authorization": "Bearer wrong"}
                    ) as resp:
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1
                text = await (await self.session.get(self.url + "/metrics")).text()
                counted = next((line.rsplit(" ", 1)[1] for line in text.splitlines()
                                if line.startswith("sentinel_ingest_rejected_total{") and 'reason="unauthorized"' in line), "?")  # fmt: skip
                return f"{sum(statuses.values())} bad-token stream requests: HTTP {statuses}; counted {counted}; {self.log_lines() - lines} refusal log lines"

            async def big_hosts_answer() -> str:
                status, doc, size, elapsed = await self.api("/api/v1/hosts")
                nope, _, _, _ = await self.api("/api/v1/hosts", token=None)
                return f"/api/v1/hosts: HTTP {status}, {len(doc['hosts'])} of {doc['total']} hosts, {size / 1e6:.2f} MB, {elapsed * 1000:.0f} ms; without read token HTTP {nope}"

            async def idle_sockets() -> str:
                port = int(self.url.rsplit(":", 1)[1])
                conns = []
                for _ in range(int(500 * scale)):
                    r, w = await asyncio.open_connection("127.0.0.1", port)
                    w.write(b"GET /api/v1/stream HTTP/1.1\r\n")
                    conns.append((r, w))
                started = time.perf_counter()
                closed = 0
                for r, w in conns:
                    with contextlib_suppress():
                        try:
                            closed += await asyncio.wait_for(r.read(), 10) == b""
                        except ConnectionResetError:  # over the per-peer limit: reset at accept
                            closed += 1
                    w.close()
                return f"{len(conns)} half-sent requests: {closed} closed by the aggregator within {time.perf_counter() - started:.1f} s"

            async def no_hello() -> str:
                sockets = [await self.ws(TOKEN_A, None) for _ in range(int(100 * scale))]
                codes = [await self.close_code(ws) for ws in sockets]
                return f"{len(sockets)} upgraded streams without a Hello: closes {_sorted_codes(codes)}"

            async def per_peer() -> str:
                sockets, refused = [], 0
                for i in range(250):
                    try:
                        sockets.append(await self.ws(TOKEN_A, f"rack-a-p{i}"))
                    except aiohttp.WSServerHandshakeError as exc:
                        refused += exc.status == 503
                for ws in sockets:
                    await ws.close()
                return f"250 streams from one address: {len(sockets)} accepted, {refused} answered 503"

            async def future_sample() -> str:
                ws = await self.ws(TOKEN_A, "rack-a-clock")
                now = time.time()
                await ws.send_bytes(
                    encode(Batch(seq=0, t=now, samples=[sample(0, now + 365 * 86400, temp=20.0)]))
                )
                await self.ack(ws)
                await ws.send_bytes(encode(Batch(seq=1, t=now + 1, samples=[sample(0, now + 1, temp=91.0)])))
                await self.ack(ws)
                await ws.close()
                _, doc, _, _ = await self.api("/api/v1/hosts?limit=500&offset=0")
                hosts = []
                offset: Any = 0
                while offset is not None:
                    _, doc, _, _ = await self.api(f"/api/v1/hosts?offset={offset}")
                    hosts += doc["hosts"]
                    offset = doc["next_offset"]
                host = next(h for h in hosts if h["name"] == "rack-a-clock")
                return f"sample a year ahead, then a real one: GPU 0 temp now {host['gpus'][0].get('temp_c')} (the real one)"

            for name, tried, body in (
                ("host takeover", "token of rack-a-* claims rack-b-01, fake reboot, seq 10^12", takeover),
                (
                    "huge ranks lists",
                    "heads with 32,769-rank lists; then 16 x 32,768-rank lists per batch",
                    huge_ranks,
                ),
                ("240k procs", "one batch with 240,000 ProcInfo", procs_flood),
                (
                    "stuck detector cost",
                    "world 131,072 with 256 in-flight seqs, heads every 0.5 s",
                    stuck_cost,
                ),
                ("fake host names", "3,000 host names from a token bound to fake-*", fake_hosts),
                ("idle TCP flood", "1,500 TCP connections from one address that send nothing", tcp_flood),
                ("refusal flood", "3,000 stream requests with a wrong token", refusal_flood),
                (
                    "big REST answer",
                    "GET /api/v1/hosts with 1,000 hosts; without the read token",
                    big_hosts_answer,
                ),
                ("retention", "wait for host_forget_after_s after the fake names", retention),
                ("idle sockets", "500 TCP connections that never finish their headers", idle_sockets),
                ("no Hello", "100 upgraded streams that never send a Hello", no_hello),
                ("one peer, many streams", "250 streams from 127.0.0.1 (limit 200)", per_peer),
                ("clock a year ahead", "one sample stamped a year ahead", future_sample),
            ):
                await attack(name, tried, body)
            await real.close()


class contextlib_suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (TimeoutError, ConnectionError))  # type: ignore[arg-type]


def start_aggregator(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    (workdir / "tokens").write_text(f"{TOKEN_A} rack-a-*\n{TOKEN_B} rack-b-*\n{TOKEN_FAKE} fake-*\n")
    (workdir / "api-tokens").write_text(READ_TOKEN + "\n")
    (workdir / "aggregator.toml").write_text(CONFIG.format(dir=workdir))
    log = (workdir / "aggregator.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "aggregator", "run", "--config", str(workdir / "aggregator.toml"), "--log-level", "info"],
        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in (workdir / "aggregator.log").read_text().splitlines():
            if "aggregator_listening" in line:
                address = json.loads(line)["addresses"][0]
                return proc, f"http://{address}"
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("aggregator did not start:\n" + (workdir / "aggregator.log").read_text())


PROBE_CHILD = """
import asyncio, os, sys, psutil
sys.path.insert(0, os.getcwd())
from sentinel.agent.probe import ProbeServer
async def main():
    server = ProbeServer(sys.argv[1], mode=0o666)
    await server.start()
    me = psutil.Process()
    print("rss", me.memory_info().rss, flush=True)
    await asyncio.to_thread(sys.stdin.readline)   # the flood is being sent meanwhile
    await asyncio.sleep(2.0)
    print("rss", me.memory_info().rss, len(server), server.overflowed, server.received, flush=True)
    server.close()
asyncio.run(main())
"""


def probe_flood(workdir: Path, scale: float) -> Row:
    import socket

    row = Row(
        "probe datagram flood", "20,000 datagrams of 60 KiB (heads with 12k-rank lists) at the probe socket"
    )
    path = str(workdir / "probe.sock")
    child = subprocess.Popen([sys.executable, "-c", PROBE_CHILD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    row.rss_before = int(child.stdout.readline().split()[1]) / 1e6
    heads = FrHeads(rank=0, t=time.time(), job_id="j", pgs=[PgHead(pg_name="0", ranks=list(range(12000)))])
    data = msgspec.msgpack.encode(heads)
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.settimeout(0.05)
    sent = 0
    started = time.perf_counter()
    for _ in range(int(20000 * scale)):
        try:
            sender.sendto(data, path)
            sent += 1
        except TimeoutError:
            pass  # the agent's socket buffer is full: the sender drops it, as sentinel.probe does
    child.stdin.write("go\n")
    child.stdin.flush()
    _, rss, pending, overflowed, received = child.stdout.readline().split()
    row.seconds = time.perf_counter() - started
    row.rss_after = int(rss) / 1e6
    row.result = f"{sent} sent ({len(data)} B each), {received} received, {pending} queued, {overflowed} dropped oldest-first"
    child.wait(10)
    return row


def config_reads(workdir: Path) -> list[Row]:
    rows = []
    fifo = workdir / "fifo.toml"
    os.mkfifo(fifo)
    deep = workdir / "deep.toml"
    deep.write_text("a = " + "[" * 100000 + "]" * 100000 + "\n")
    for name, target in (
        ("config check /dev/zero", "/dev/zero"),
        ("config check FIFO", str(fifo)),
        ("config check deep TOML", str(deep)),
    ):
        row = Row(name, f"sentinel config check {target}")
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "sentinel", "config", "check", target], capture_output=True, text=True,
                                timeout=30, cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
        row.seconds = time.perf_counter() - started
        row.result = f"exit {result.returncode}: {result.stderr.strip()[:120]}"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the attack counts (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sentinel-attack-") as tmp:
        workdir = Path(tmp)
        proc, url = start_aggregator(workdir)
        rows: list[Row] = []
        try:
            ps = psutil.Process(proc.pid)
            print(f"aggregator pid {proc.pid} at {url}, RSS {rss_mb(ps):.0f} MB", flush=True)
            asyncio.run(Attacker(url, ps, workdir / "aggregator.log").run(rows, args.scale))
            alive = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(15)
        rows.append(probe_flood(workdir, args.scale))
        rows.extend(config_reads(workdir))
        log_bytes = (workdir / "aggregator.log").stat().st_size
    print()
    print("| attack | tried | result | RSS before → after (MB) | s |")
    print("|---|---|---|---|---|")
    for row in rows:
        rss = f"{row.rss_before:.0f} → {row.rss_after:.0f}" if row.rss_before else "—"
        print(f"| {row.name} | {row.tried} | {row.result} | {rss} | {row.seconds:.1f} |")
    print(f"\naggregator alive through every attack: {alive}; its log: {log_bytes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()

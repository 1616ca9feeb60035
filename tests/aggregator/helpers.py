"""Shared helpers for aggregator tests: frames, a running aggregator on 127.0.0.1, bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from sentinel.aggregator.detectors.straggler import StragglerDetector
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.listener import AggregatorSite
from sentinel.aggregator.server import AGGREGATOR_KEY, Aggregator, create_app, make_runner
from sentinel.aggregator.state import HostView
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import (
    Ack,
    Batch,
    Command,
    Event,
    GpuInfo,
    GpuSample,
    Hello,
    XidOccurred,
    decode_aggregator_frame,
    encode,
)

TOKEN = "test-token-0123456789"


def hello(host: str, gpus: int = 8) -> Hello:
    return Hello(
        host=host,
        boot_id="boot-1",
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{host}-{i}", pci_bus=f"0000:{0x18 + i:02x}:00", name="H100")
            for i in range(gpus)
        ],
    )


def sample(gpu: int, t: float, **fields: object) -> GpuSample:
    base: dict[str, object] = {
        "util_gpu_pct": 99.0,
        "temp_c": 65.0,
        "power_w": 640.0,
        "sm_clock_mhz": 1980.0,
        "sm_clock_max_mhz": 1980.0,
    }
    base.update(fields)
    return GpuSample(gpu=gpu, t=t, **base)  # type: ignore[arg-type]


def batch(seq: int, t: float, gpus: int = 8, events: list[Event] | None = None) -> Batch:
    return Batch(seq=seq, t=t, samples=[sample(i, t) for i in range(gpus)], events=events or [])


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@dataclass
class Running:
    url: str
    app: web.Application
    runner: web.AppRunner

    @property
    def aggregator(self) -> Aggregator:
        return self.app[AGGREGATOR_KEY]

    @property
    def stream_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/api/v1/stream"


@asynccontextmanager
async def running_aggregator(
    tmp_path: Path, config: AggregatorConfig | None = None, tokens: list[str] | None = None, **kwargs: object
) -> AsyncIterator[Running]:
    app = create_app(
        config or AggregatorConfig(),
        tokens=tokens if tokens is not None else [TOKEN],
        state_dir=tmp_path,
        **kwargs,  # type: ignore[arg-type]
    )
    runner = make_runner(app)
    await runner.setup()
    site = AggregatorSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Running(url=f"http://127.0.0.1:{port}", app=app, runner=runner)
    finally:
        if runner.server is not None:  # (a test may have shut it down itself)
            await runner.cleanup()


class AgentConn:
    """A minimal agent: connect, hello, send batches, read acks."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.session = session
        self.ws = ws
        self.commands: list[Command] = []

    async def send(self, frame: object) -> None:
        await self.ws.send_bytes(encode(frame))  # type: ignore[arg-type]

    async def ack(self, timeout: float = 5.0) -> int:
        """The next ack's seq (commands received meanwhile are kept in ``commands``)."""
        while True:
            msg = await self.ws.receive(timeout=timeout)
            assert msg.type == aiohttp.WSMsgType.BINARY, msg
            frame = decode_aggregator_frame(msg.data)
            if isinstance(frame, Ack):
                return frame.seq
            self.commands.append(frame)


@asynccontextmanager
async def agent(running: Running, host: str, token: str = TOKEN, gpus: int = 8) -> AsyncIterator[AgentConn]:
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(
            running.stream_url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0
        )
        conn = AgentConn(session, ws)
        await conn.send(hello(host, gpus))
        try:
            yield conn
        finally:
            await ws.close()


def kernel_xid(t: float, gpu: int, code: int) -> XidOccurred:
    """An Xid as the agent sends one it read in the kernel log: classified from the driver's line."""
    text = f"NVRM: Xid (PCI:0000:1b:00): {code}"
    return XidOccurred(t=t, gpu=gpu, text=text, record=xid_record(code, text))


class Fleet:
    """A few hosts fed straight into an engine (no sockets): the same path as ingest."""

    def __init__(self, hosts: int = 2, gpus: int = 8) -> None:
        self.engine = Engine()
        self.gpus = gpus
        self.views: dict[str, HostView] = {}
        self.seq: dict[str, int] = {}
        for h in range(hosts):
            name = f"h{h}"
            self.views[name] = self.engine.hello(hello(name, gpus), 0.0)
            self.seq[name] = 0

    def send(self, host: str, t: float, **kwargs: object) -> None:
        samples = kwargs.pop("samples", None)
        if samples is None:
            samples = [sample(i, t) for i in range(self.gpus)]
        batch = Batch(seq=self.seq[host], t=t, samples=samples, **kwargs)  # type: ignore[arg-type]
        self.seq[host] += 1
        self.engine.ingest(self.views[host], batch, t)

    def open(self) -> list[tuple[str, str | None, int | None, str]]:
        return sorted((v.kind, v.host, v.gpu, v.reason) for v in self.engine.book.open.values())


def straggler_of(engine: Engine) -> StragglerDetector:
    """The engine's straggler detector, for tests that look into its memory."""
    detector = engine.detectors["straggler"]
    assert isinstance(detector, StragglerDetector)
    return detector

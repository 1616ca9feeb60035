"""Streaming to an aggregator that is killed and restarted: nothing lost, duplicates only as resends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web

from sentinel.agent import Agent
from sentinel.config.agent import AgentConfig
from sentinel.wire import (
    Ack,
    Batch,
    Command,
    CommandResult,
    FrDumpAnswer,
    FrDumpRequest,
    Hello,
    Snapshot,
    SnapshotRequest,
    XidOccurred,
    decode_agent_frame,
    encode,
)
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeHost, FakeSource

TOKEN = "s3cret-token"


class FakeAggregator:
    """Accepts agent streams on 127.0.0.1, acks every batch, can send commands."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.hellos: list[Hello] = []
        self.results: list[CommandResult] = []
        self.unauthorized = 0
        self.commands: list[Command] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.unauthorized += 1
            raise web.HTTPUnauthorized()
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY:
                continue
            frame = decode_agent_frame(message.data)
            if isinstance(frame, Hello):
                self.hellos.append(frame)
                for command in self.commands:
                    await ws.send_bytes(encode(command))
                self.commands = []
            elif isinstance(frame, Batch):
                self.batches.append(frame)
                await ws.send_bytes(encode(Ack(seq=frame.seq)))
            else:
                self.results.append(frame)
        return ws

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/api/v1/stream", self._stream)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if not self.port:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def seqs(self) -> set[int]:
        return {b.seq for b in self.batches}


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def stream_config(tmp_path: Path, port: int, **extra: object) -> object:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    stream = {
        "enabled": True,
        "aggregator_url": f"ws://127.0.0.1:{port}/api/v1/stream",
        "token_file": str(token),
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        **extra,
    }
    collect: dict[str, object] = {"tick_s": 0.05, "slow_tick_s": 0.2, "xid_merge_wait_s": 0.1}
    return make_config(tmp_path, stream=stream, collect=collect)


async def test_outage_loses_nothing(tmp_path: Path) -> None:
    aggregator = FakeAggregator()
    port = await aggregator.start()
    agent = Agent(stream_config(tmp_path, port), FakeSource(gpus=2))  # type: ignore[arg-type]
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: len(aggregator.batches) >= 5)
        assert aggregator.hellos[0].host == "host-test" and len(aggregator.hellos[0].gpus) == 2
        await aggregator.stop()
        ticks = agent.counters.ticks
        await wait_for(lambda: agent.counters.ticks >= ticks + 15 and not agent.counters.connected)
        assert agent.spool is not None and len(agent.spool) >= 10  # spooled while disconnected
        await aggregator.start()  # same port
        await wait_for(
            lambda: agent.spool is not None and len(agent.spool) <= 2 and len(aggregator.hellos) >= 2
        )
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)
        await aggregator.stop()
    assert agent.spool is not None and len(agent.spool) == 0  # the shutdown drain delivered the rest
    produced = agent.seq.next
    assert aggregator.seqs() == set(range(produced))  # no batch lost
    by_seq: dict[int, Batch] = {}
    for batch in aggregator.batches:  # a resend carries the same batch
        assert by_seq.setdefault(batch.seq, batch) == batch
    samples = sum(len(b.samples) for b in by_seq.values())
    assert samples == 2 * produced
    assert agent.counters.batches_acked == produced


async def test_spool_survives_agent_restart_and_seq_keeps_rising(tmp_path: Path) -> None:
    aggregator = FakeAggregator()
    port = await aggregator.start()
    await aggregator.stop()  # nobody listening: everything goes to the spool
    config = stream_config(tmp_path, port)
    first = Agent(config, FakeSource(gpus=1))  # type: ignore[arg-type]
    task = asyncio.create_task(first.run())
    await wait_for(lambda: first.counters.ticks >= 5)
    first.request_stop()  # what SIGTERM does
    await asyncio.wait_for(task, 15)
    spooled = sorted(p.name for p in (tmp_path / "state" / "spool").iterdir())
    assert len(spooled) >= 5
    produced_first = first.seq.next

    await aggregator.start()
    second = Agent(config, FakeSource(gpus=1))  # type: ignore[arg-type]
    task = asyncio.create_task(second.run())
    try:
        await wait_for(
            lambda: set(range(produced_first)) <= aggregator.seqs() and len(aggregator.hellos) >= 1
        )
        await wait_for(lambda: any(b.seq > produced_first for b in aggregator.batches))
    finally:
        second.request_stop()
        await asyncio.wait_for(task, 15)
        await aggregator.stop()
    by_seq: dict[int, Batch] = {}
    for batch in aggregator.batches:  # a reused seq would show up as two different batches
        assert by_seq.setdefault(batch.seq, batch) == batch
    assert set(range(produced_first)) <= set(by_seq)
    assert min(s for s in by_seq if s >= produced_first) >= produced_first
    assert aggregator.hellos[0].next_seq == 0  # the oldest spooled batch comes first


async def test_commands_snapshot_and_fr_dump(tmp_path: Path) -> None:
    aggregator = FakeAggregator()
    aggregator.commands = [
        Command(id="c1", request=SnapshotRequest(since=0.0)),
        Command(id="c2", request=FrDumpRequest(job="nope")),
    ]
    port = await aggregator.start()
    agent = Agent(stream_config(tmp_path, port), FakeSource(gpus=1))  # type: ignore[arg-type]
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: len(aggregator.results) >= 2)
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)
        await aggregator.stop()
    results = {r.id: r for r in aggregator.results}
    snapshot, dumped = results["c1"].answer, results["c2"].answer
    assert results["c1"].ok and isinstance(snapshot, Snapshot) and snapshot.host == "host-test"
    assert snapshot.entries and snapshot.window[0] <= snapshot.window[1]
    assert results["c2"].ok and isinstance(dumped, FrDumpAnswer) and dumped.pipes == []


async def test_wrong_token_is_refused_and_retried(tmp_path: Path) -> None:
    aggregator = FakeAggregator()
    port = await aggregator.start()
    config = stream_config(tmp_path, port)
    (tmp_path / "token").write_text("wrong\n")
    agent = Agent(config, FakeSource(gpus=1))  # type: ignore[arg-type]
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: aggregator.unauthorized >= 2)  # backs off and retries, never dies
        (tmp_path / "token").write_text(TOKEN)
        await wait_for(lambda: len(aggregator.batches) >= 3)
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)
        await aggregator.stop()


async def test_wss_with_ca_file(tmp_path: Path) -> None:
    import ssl
    import subprocess

    from tests.support import need_binary

    openssl = need_binary("openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    aggregator = FakeAggregator()
    app = web.Application()
    app.router.add_get("/api/v1/stream", aggregator._stream)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = stream_config(tmp_path, port, ca_file=str(cert))
    config.stream.aggregator_url = f"wss://127.0.0.1:{port}/api/v1/stream"  # type: ignore[attr-defined]
    agent = Agent(config, FakeSource(gpus=1))  # type: ignore[arg-type]
    (tmp_path / "other").mkdir()
    untrusting_config = stream_config(tmp_path / "other", port)  # system CAs: our self-signed cert is refused
    untrusting_config.stream.aggregator_url = config.stream.aggregator_url  # type: ignore[attr-defined]
    untrusting = Agent(untrusting_config, FakeSource(gpus=1))  # type: ignore[arg-type]
    tasks = [asyncio.create_task(agent.run()), asyncio.create_task(untrusting.run())]
    try:
        await wait_for(lambda: len(aggregator.batches) >= 2)
        assert untrusting.shipper is not None
        await wait_for(lambda: "certificate" in untrusting.shipper.last_error.lower())  # type: ignore[union-attr]
    finally:
        agent.request_stop()
        untrusting.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        await runner.cleanup()
    assert aggregator.hellos and {h.host for h in aggregator.hellos} == {"host-test"}


async def test_outage_beyond_the_bound_drops_samples_first_and_reports_it(tmp_path: Path) -> None:
    """Ticks are stepped one by one on a virtual clock, none while the backlog drains: which batches lose
    their samples is decided by the outage alone, never by how fast the acks come back (a tick that spooled
    a batch while a sent one awaited its ack would strip that one, which the aggregator had whole)."""
    aggregator = FakeAggregator()
    port = await aggregator.start()
    await aggregator.stop()  # down from the start
    host = FakeHost()
    config = stream_config(tmp_path, port, spool_max_bytes=12000)  # fits the events, not the samples
    assert isinstance(config, AgentConfig)
    # the fake source never hangs: no read may be declared unresponsive however loaded the machine is
    config = msgspec.structs.replace(
        config, collect=msgspec.structs.replace(config.collect, nvml_timeout_s=30.0)
    )
    clock = [1000.0]
    agent = Agent(config, FakeSource(gpus=4), host.inputs(), clock=lambda: clock[0])

    async def tick(*, final: bool = False) -> None:
        await agent.step(clock[0], final=final)
        clock[0] += config.collect.tick_s

    await agent.start()
    try:
        for i in range(30):  # one Xid line every tick, so every batch carries an event
            host.kernel.append(f"NVRM: Xid (PCI:0000:18:00): {100 + i}, pid=1, name=python, test")
            await tick()
        assert agent.spool is not None and agent.spool.size_bytes <= 12000
        assert agent.spool.dropped_samples > 0  # the outage went beyond the bound
        await aggregator.start()
        await wait_for(lambda: agent.spool is not None and len(agent.spool) == 0)
        await tick()  # carries the drops of the outage's last tick
        await tick(final=True)  # and the Xids still waiting for an NVML twin
        await wait_for(lambda: agent.spool is not None and len(agent.spool) == 0)
    finally:
        await agent.shutdown()
        await aggregator.stop()
    by_seq = {b.seq: b for b in aggregator.batches}
    xids = sorted(e.record.xid for b in by_seq.values() for e in b.events if isinstance(e, XidOccurred))
    assert xids == [100 + i for i in range(30)]  # events survived the overflow
    stripped = [seq for seq, b in sorted(by_seq.items()) if not b.samples]
    assert stripped and stripped == sorted(by_seq)[: len(stripped)]  # samples went oldest first
    reported = sum(b.drops.samples for b in by_seq.values() if b.drops is not None)
    assert reported == 4 * len(stripped)  # and the drop was reported
    assert agent.counters.dropped["samples"] == reported

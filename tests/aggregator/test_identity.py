"""Host identity on real sockets: tokens bound to host globs, mutual TLS, answers bound to their connection,
dedup across a reimage. Each test replays an attack that once worked and shows it refused."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import msgspec
import pytest
import structlog
from aiohttp import web

from sentinel.aggregator.identity import TokenError, load_tokens, server_ssl_context
from sentinel.aggregator.listener import AggregatorSite
from sentinel.aggregator.server import AGGREGATOR_KEY, create_app
from sentinel.aggregator.stream import CLOSE_HOST_NOT_ALLOWED
from sentinel.config.aggregator import AggregatorConfig, ServerConfig
from sentinel.fr.heads import FrHeads
from sentinel.wire import (
    Ack,
    Batch,
    Command,
    CommandResult,
    Hello,
    ProcInfo,
    Snapshot,
    SnapshotRequest,
    decode_aggregator_frame,
    encode,
)
from tests.aggregator.helpers import Running, batch, hello, kernel_xid, running_aggregator, wait_until
from tests.support import need_binary

RACK_A = "token-rack-a-0123456789"
RACK_B = "token-rack-b-0123456789"
GRANTS = [f"{RACK_A} rack-a-*", f"{RACK_B} rack-b-* spare-07"]
SHARED = {"Authorization": "Bearer shared-token"}


async def connect(url: str, token: str) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    session = aiohttp.ClientSession()
    try:
        ws = await session.ws_connect(url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0)
    except BaseException:
        await session.close()
        raise
    return session, ws


async def next_frame(ws: aiohttp.ClientWebSocketResponse, wanted: Callable[[object], bool]) -> object:
    """The next frame from the aggregator that ``wanted`` accepts: the host's verdict pushback (a
    VerdictsRequest after a tick) may come before or between the frames a test waits for."""
    while True:
        frame = decode_aggregator_frame((await ws.receive(timeout=5)).data)
        if wanted(frame):
            return frame


async def next_ack(ws: aiohttp.ClientWebSocketResponse) -> int:
    frame = await next_frame(ws, lambda f: isinstance(f, Ack))
    assert isinstance(frame, Ack)
    return frame.seq


async def close_code(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    msg = await ws.receive(timeout=5.0)
    while msg.type == aiohttp.WSMsgType.BINARY:
        msg = await ws.receive(timeout=5.0)
    return ws.close_code


def rejected(aggregator: object, reason: str) -> float:
    registry = aggregator.metrics.registry  # type: ignore[attr-defined]
    return (
        registry.get_sample_value("sentinel_ingest_rejected_total", {"cluster": "default", "reason": reason})
        or 0.0
    )


def test_tokens_file_binds_tokens_to_host_globs(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\n\nalpha host-0* gpu-node-17\nbeta\n")
    alpha, beta = load_tokens(path)
    assert alpha.hosts == ("host-0*", "gpu-node-17") and alpha.line == 3
    assert alpha.allows("host-007") and alpha.allows("gpu-node-17")
    assert not alpha.allows("host-100") and not alpha.allows("gpu-node-170")
    assert beta.any_host and beta.allows("anything")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TokenError, match="is a FIFO, not a regular file"):
        load_tokens(fifo)  # once blocked the aggregator's start for ever
    path.write_text("gamma host/../x\n")
    with pytest.raises(TokenError, match=r"tokens: line token 1: 'host/\.\./x' is not a host name glob"):
        load_tokens(path)


async def test_token_only_line_is_a_startup_warning(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        create_app(AggregatorConfig(), tokens=["lonely-token", f"{RACK_A} rack-a-*"], state_dir=tmp_path)
    warnings = [e for e in logs if e["event"] == "token_any_host"]
    assert [w["line"] for w in warnings] == [1]
    assert warnings[0]["log_level"] == "warning"


async def test_hello_for_another_tokens_host_is_refused_and_the_real_stream_is_unaffected(
    tmp_path: Path,
) -> None:
    async with running_aggregator(tmp_path, tokens=GRANTS) as running:
        aggregator = running.aggregator
        real_session, real = await connect(running.stream_url, RACK_B)
        try:
            await real.send_bytes(encode(hello("rack-b-01")))
            await real.send_bytes(encode(batch(0, time.time())))
            assert await next_ack(real) == 0
            state_before = aggregator.engine.fleet.hosts["rack-b-01"]
            hw_before = state_before.seq_hw
            # the attack: a valid token for rack A claims rack B's host, then a fake reboot and huge seqs
            with structlog.testing.capture_logs() as logs:
                session, ws = await connect(running.stream_url, RACK_A)
                try:
                    forged = Hello(host="rack-b-01", boot_id="forged-boot", gpus=hello("rack-b-01").gpus)
                    await ws.send_bytes(encode(forged))
                    await ws.send_bytes(encode(batch(10**12, time.time())))
                    assert await close_code(ws) == CLOSE_HOST_NOT_ALLOWED
                finally:
                    await session.close()
            refusal = [e for e in logs if e.get("reason") == "host_not_allowed"]
            assert refusal and refusal[0]["claimed"] == "rack-b-01" and refusal[0]["peer"] == "127.0.0.1"
            assert rejected(aggregator, "host_not_allowed") == 1
            # the real stream is still the host's, with its boot id and dedup window as they were
            assert aggregator.by_host["rack-b-01"].ws is not None and not real.closed
            host = aggregator.engine.fleet.hosts["rack-b-01"]
            assert host.boot_id == "boot-1" and host.seq_hw == hw_before
            await real.send_bytes(encode(batch(1, time.time())))
            assert await next_ack(real) == 1
            assert host.batches == 2  # applied, not dropped as a "duplicate" of the forged seq
            # a token may speak for every glob on its line
            s2, other = await connect(running.stream_url, RACK_B)
            try:
                await other.send_bytes(encode(hello("spare-07")))
                await wait_until(lambda: "spare-07" in aggregator.by_host)
            finally:
                await s2.close()
        finally:
            await real_session.close()


@asynccontextmanager
async def two_racks(
    running: Running,
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, aiohttp.ClientWebSocketResponse]]:
    """rack-a-01 and rack-b-01 connected, each with its own host's token, both hellos applied."""
    sa, a = await connect(running.stream_url, RACK_A)
    sb, b = await connect(running.stream_url, RACK_B)
    try:
        await a.send_bytes(encode(hello("rack-a-01")))
        await b.send_bytes(encode(hello("rack-b-01")))
        await wait_until(lambda: {"rack-a-01", "rack-b-01"} <= set(running.aggregator.by_host))
        yield a, b
    finally:
        await sa.close()
        await sb.close()


async def test_a_command_answer_from_another_connection_is_refused(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path, tokens=GRANTS) as running, two_racks(running) as (victim, forger):
        aggregator = running.aggregator
        request = asyncio.create_task(
            aggregator.request("rack-a-01", Command(id="cmd-1", request=SnapshotRequest()), timeout_s=5)
        )
        sent = await next_frame(victim, lambda f: not isinstance(f, Command) or f.name != "verdicts")
        assert isinstance(sent, Command) and sent.id == "cmd-1"
        await forger.send_bytes(
            encode(CommandResult(id="cmd-1", answer=Snapshot(host="forged", window=(0.0, 1.0))))
        )
        await wait_until(lambda: rejected(aggregator, "foreign_answer") == 1)
        assert not request.done()
        await victim.send_bytes(
            encode(CommandResult(id="cmd-1", answer=Snapshot(host="rack-a-01", window=(0.0, 1.0))))
        )
        result = await asyncio.wait_for(request, 5)
        assert result is not None and isinstance(result.answer, Snapshot)
        assert result.answer.host == "rack-a-01"


async def test_a_reimaged_host_starting_at_seq_0_is_not_dropped_as_duplicates(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path, tokens=GRANTS) as running:
        aggregator = running.aggregator
        session, ws = await connect(running.stream_url, RACK_A)
        try:
            await ws.send_bytes(encode(hello("rack-a-01")))
            for seq in (5000, 5001):
                await ws.send_bytes(encode(batch(seq, time.time())))
                await ws.receive(timeout=5)
        finally:
            await session.close()
        host = aggregator.engine.fleet.hosts["rack-a-01"]
        assert host.batches == 2
        # same boot: a resend of 5001 is still a duplicate
        session, ws = await connect(running.stream_url, RACK_A)
        try:
            await ws.send_bytes(encode(Hello(host="rack-a-01", boot_id="boot-1", next_seq=5001)))
            await ws.send_bytes(encode(batch(5001, time.time())))
            await ws.receive(timeout=5)
            assert host.batches == 2 and host.duplicates == 1
        finally:
            await session.close()
        # reimaged: new boot id, seq file gone, numbering starts at 0
        session, ws = await connect(running.stream_url, RACK_A)
        try:
            await ws.send_bytes(encode(Hello(host="rack-a-01", boot_id="boot-2", next_seq=0)))
            t = time.time() + 1
            await ws.send_bytes(encode(batch(0, t)))
            assert await next_ack(ws) == 0
            assert host.batches == 3 and host.gpus[0].t == t  # applied, not acked-and-dropped
        finally:
            await session.close()


def _openssl(tmp_path: Path, *args: str) -> None:
    subprocess.run([need_binary("openssl"), *args], check=True, capture_output=True, timeout=60, cwd=tmp_path)


SERVER_AND_RACKS = (
    ("server", "/CN=127.0.0.1", "IP:127.0.0.1"),
    ("rack-a-01", "/CN=rack-a-01", "DNS:rack-a-01"),
    ("rack-b-01", "/CN=rack-b-01", "DNS:rack-b-01"),
)


def make_pki(
    tmp_path: Path,
    ca: str = "ca",
    certs: tuple[tuple[str, str, str], ...] = SERVER_AND_RACKS,
    prefix: str = "",
) -> None:
    """A CA (``<ca>.pem``) and certificates it signs (``<prefix><name>.pem``): by default a server
    certificate for 127.0.0.1 and client certificates for rack-a-01 and rack-b-01."""
    _openssl(tmp_path, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN=test-{ca}",
             "-keyout", f"{ca}.key", "-out", f"{ca}.pem")  # fmt: skip
    for bare, subject, san in certs:
        name = prefix + bare
        _openssl(tmp_path, "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr")  # fmt: skip
        (tmp_path / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _openssl(tmp_path, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem")  # fmt: skip


@asynccontextmanager
async def mtls_aggregator(tmp_path: Path) -> AsyncIterator[tuple[web.Application, str]]:
    """The real aggregator with mutual TLS on 127.0.0.1 (``make_pki``'s CA and server certificate): its app
    and its stream's wss:// URL."""
    server = ServerConfig(
        tls_cert_file=str(tmp_path / "server.pem"),
        tls_key_file=str(tmp_path / "server.key"),
        tls_client_ca_file=str(tmp_path / "ca.pem"),
    )
    app = create_app(AggregatorConfig(server=server), tokens=["shared-token rack-*"], state_dir=tmp_path)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = AggregatorSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(server))
    await site.start()
    try:
        yield app, f"wss://127.0.0.1:{runner.addresses[0][1]}/api/v1/stream"
    finally:
        await runner.cleanup()


def client_tls(tmp_path: Path, cert: str | None, trust: str = "ca.pem") -> ssl.SSLContext:
    """An agent's TLS context: trusting ``trust``, presenting ``<cert>.pem`` (None: no certificate)."""
    context = ssl.create_default_context(cafile=str(tmp_path / trust))
    if cert:
        context.load_cert_chain(str(tmp_path / f"{cert}.pem"), str(tmp_path / f"{cert}.key"))
    return context


async def streams(session: aiohttp.ClientSession, url: str, context: ssl.SSLContext, host: str) -> None:
    """Connect with ``context``, say hello as ``host``, have a batch acked."""
    ws = await session.ws_connect(url, headers=SHARED, ssl=context)
    await ws.send_bytes(encode(hello(host)))
    await ws.send_bytes(encode(batch(0, time.time())))
    assert await next_ack(ws) == 0
    await ws.close()


async def test_mutual_tls_binds_the_host_to_the_client_certificate(tmp_path: Path) -> None:
    make_pki(tmp_path)
    async with mtls_aggregator(tmp_path) as (app, url), aiohttp.ClientSession() as session:
        aggregator = app[AGGREGATOR_KEY]
        # no client certificate: the TLS handshake itself fails
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            ws = await session.ws_connect(url, headers=SHARED, ssl=client_tls(tmp_path, None))
            await ws.send_bytes(encode(hello("rack-a-01")))
            await ws.receive(timeout=5)
            raise ConnectionError(f"closed {ws.close_code}")
        # rack-a-01's certificate and a token valid for rack-*: may not claim rack-b-01
        ws = await session.ws_connect(url, headers=SHARED, ssl=client_tls(tmp_path, "rack-a-01"))
        await ws.send_bytes(encode(hello("rack-b-01")))
        assert await close_code(ws) == CLOSE_HOST_NOT_ALLOWED
        await streams(session, url, client_tls(tmp_path, "rack-a-01"), "rack-a-01")
        assert set(aggregator.by_host) == {"rack-a-01"}


def test_tls_misconfiguration_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match=r"needs server\.tls_cert_file"):
        server_ssl_context(ServerConfig(tls_client_ca_file="/x/ca.pem"))
    with pytest.raises(TokenError, match=r"^/nonexistent/cert\.pem: cannot load"):
        server_ssl_context(ServerConfig(tls_cert_file="/nonexistent/cert.pem"))


async def test_a_reinstalled_agent_on_the_same_boot_is_a_new_stream_not_duplicates(tmp_path: Path) -> None:
    """Same boot id, the agent's state directory wiped: its seqs restart at 1 under a new instance id. Its
    Xid 79 in batch 1 (long acked in the old numbering) is applied and opens a verdict."""
    async with running_aggregator(tmp_path, tokens=GRANTS) as running:
        aggregator = running.aggregator
        old = msgspec.structs.replace(hello("rack-a-01"), instance_id="instance-old-0001", next_seq=1)
        session, ws = await connect(running.stream_url, RACK_A)
        try:
            await ws.send_bytes(encode(old))
            for seq in range(1, 41):
                await ws.send_bytes(encode(batch(seq, time.time())))
                assert await next_ack(ws) == seq
        finally:
            await session.close()
        host = aggregator.engine.fleet.hosts["rack-a-01"]
        # the old instance again (a plain reconnect): its numbering and window stay
        session, ws = await connect(running.stream_url, RACK_A)
        try:
            await ws.send_bytes(encode(msgspec.structs.replace(old, next_seq=40)))
            await ws.send_bytes(encode(batch(40, time.time())))
            assert await next_ack(ws) == 40
            assert host.duplicates == 1 and host.seq_hw == 40
        finally:
            await session.close()
        new = msgspec.structs.replace(old, instance_id="instance-new-0002", next_seq=1)
        with structlog.testing.capture_logs() as logs:
            session, ws = await connect(running.stream_url, RACK_A)
            try:
                await ws.send_bytes(encode(new))
                t = time.time()
                await ws.send_bytes(encode(batch(1, t, events=[kernel_xid(t, 5, 79)])))
                assert await next_ack(ws) == 1
            finally:
                await session.close()
        assert host.duplicates == 1 and host.seq_hw == 1  # applied, not dropped
        (verdict,) = aggregator.engine.book.open.values()
        assert (verdict.host, verdict.gpu, verdict.reason) == ("rack-a-01", 5, "xid_79")
        (changed,) = [entry for entry in logs if entry["event"] == "agent_instance_changed"]
        assert (changed["old"], changed["new"], changed["seq_hw"]) == (
            "instance-old-0001",
            "instance-new-0002",
            40,
        )


async def test_heads_for_another_hosts_rank_are_refused_and_counted_over_the_stream(tmp_path: Path) -> None:
    """Each host's token is valid for itself; rack-b-01 sends heads (and a process report) for the rank
    rack-a-01 runs: both refused, counted in sentinel_ingest_rejected_total, the rank stays rack-a-01's."""
    async with running_aggregator(tmp_path, tokens=GRANTS) as running, two_racks(running) as (a, b):
        aggregator = running.aggregator
        own = ProcInfo(gpu=0, pid=11, job_id="job-7", rank=0, world_size=2)
        await a.send_bytes(encode(Batch(seq=0, t=time.time(), procs=[own])))
        assert await next_ack(a) == 0
        stolen = ProcInfo(gpu=0, pid=99, job_id="job-7", rank=0, world_size=2)
        lie = FrHeads(rank=0, t=time.time(), job_id="job-7", world_size=2, gpu=0, pgs=[])
        await b.send_bytes(encode(Batch(seq=0, t=time.time(), procs=[stolen], heads=[lie])))
        assert await next_ack(b) == 0
        assert rejected(aggregator, "rank_claimed") == 1 and rejected(aggregator, "rank_not_owned") == 1
        rank = aggregator.engine.fleet.jobs["job-7"].ranks[0]
        assert (rank.host, rank.pid, rank.heads) == ("rack-a-01", 11, None)

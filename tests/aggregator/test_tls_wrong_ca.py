"""Mutual TLS with the wrong CA, on real sockets with certificates made for the test: an agent whose client
certificate another CA signed is refused in the handshake — counted, and logged with the peer's address and
the reason — and never reaches the stream; an agent that trusts another CA than the aggregator's refuses the
aggregator; the right certificate still streams."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from sentinel.aggregator.listener import AggregatorSite
from sentinel.aggregator.server import AGGREGATOR_KEY, create_app, server_ssl_context
from sentinel.config.aggregator import AggregatorConfig, ServerConfig
from sentinel.wire import encode
from tests.aggregator.helpers import batch, hello, wait_until
from tests.aggregator.test_identity import _openssl, make_pki, next_ack


def make_rogue_pki(tmp_path: Path) -> None:
    """Another CA, with a client certificate for rack-a-01 and a server certificate for 127.0.0.1."""
    _openssl(tmp_path, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=rogue-ca",
             "-keyout", "rogue-ca.key", "-out", "rogue-ca.pem")  # fmt: skip
    for name, subject, san in (
        ("rogue-rack-a-01", "/CN=rack-a-01", "DNS:rack-a-01"),
        ("rogue-server", "/CN=127.0.0.1", "IP:127.0.0.1"),
    ):
        _openssl(tmp_path, "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr")  # fmt: skip
        (tmp_path / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _openssl(tmp_path, "x509", "-req", "-in", f"{name}.csr", "-CA", "rogue-ca.pem", "-CAkey",
                 "rogue-ca.key", "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out",
                 f"{name}.pem")  # fmt: skip


def rejected(app: web.Application, reason: str) -> float:
    registry = app[AGGREGATOR_KEY].metrics.registry
    assert registry is not None
    value = registry.get_sample_value(
        "sentinel_ingest_rejected_total", {"cluster": "default", "reason": reason}
    )
    return value or 0.0


async def test_a_client_certificate_from_another_ca_is_refused_logged_and_counted(tmp_path: Path) -> None:
    make_pki(tmp_path)
    make_rogue_pki(tmp_path)
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
    url = f"wss://127.0.0.1:{runner.addresses[0][1]}/api/v1/stream"
    headers = {"Authorization": "Bearer shared-token"}
    aggregator = app[AGGREGATOR_KEY]

    def client(cert: str, trust: str = "ca.pem") -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tmp_path / trust))
        context.load_cert_chain(str(tmp_path / f"{cert}.pem"), str(tmp_path / f"{cert}.key"))
        return context

    try:
        async with aiohttp.ClientSession() as session:
            with capture_logs() as logs:
                # the same host name, the valid token, a certificate signed by the rogue CA
                with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                    ws = await session.ws_connect(url, headers=headers, ssl=client("rogue-rack-a-01"))
                    await ws.send_bytes(encode(hello("rack-a-01")))
                    await ws.receive(timeout=5)
                    raise ConnectionError(f"closed {ws.close_code}")
                await wait_until(lambda: rejected(app, "tls_handshake") >= 1)
            (line,) = [e for e in logs if e["event"] == "tls_handshake_refused"]
            assert line["peer"] == "127.0.0.1" and line["reason"] == "tls_handshake"
            assert line["detail"].startswith("client certificate not trusted: ")
            assert aggregator.by_host == {}

            # an agent that trusts the rogue CA for the server refuses the real aggregator
            with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
                await session.ws_connect(url, headers=headers, ssl=client("rack-a-01", trust="rogue-ca.pem"))

            # the right certificate still streams
            ws = await session.ws_connect(url, headers=headers, ssl=client("rack-a-01"))
            await ws.send_bytes(encode(hello("rack-a-01")))
            await ws.send_bytes(encode(batch(0, time.time())))
            assert await next_ack(ws) == 0
            assert set(aggregator.by_host) == {"rack-a-01"}
            await ws.close()
    finally:
        await runner.cleanup()

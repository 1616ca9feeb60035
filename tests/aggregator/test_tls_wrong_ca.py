"""Mutual TLS with the wrong CA, on real sockets with certificates made for the test: an agent whose client
certificate another CA signed is refused in the handshake — counted, and logged with the peer's address and
the reason — and never reaches the stream; an agent that trusts another CA than the aggregator's refuses the
aggregator; the right certificate still streams."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from sentinel.aggregator.server import AGGREGATOR_KEY
from sentinel.wire import encode
from tests.aggregator.helpers import hello, wait_until
from tests.aggregator.test_identity import SHARED, client_tls, make_pki, mtls_aggregator, streams


def rejected(app: web.Application, reason: str) -> float:
    registry = app[AGGREGATOR_KEY].metrics.registry
    assert registry is not None
    value = registry.get_sample_value(
        "sentinel_ingest_rejected_total", {"cluster": "default", "reason": reason}
    )
    return value or 0.0


async def test_a_client_certificate_from_another_ca_is_refused_logged_and_counted(tmp_path: Path) -> None:
    make_pki(tmp_path)
    rogue = (("rack-a-01", "/CN=rack-a-01", "DNS:rack-a-01"),)
    make_pki(tmp_path, ca="rogue-ca", certs=rogue, prefix="rogue-")
    async with mtls_aggregator(tmp_path) as (app, url), aiohttp.ClientSession() as session:
        aggregator = app[AGGREGATOR_KEY]
        with capture_logs() as logs:
            # the same host name, the valid token, a certificate signed by the rogue CA
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                ws = await session.ws_connect(
                    url, headers=SHARED, ssl=client_tls(tmp_path, "rogue-rack-a-01")
                )
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
            await session.ws_connect(
                url, headers=SHARED, ssl=client_tls(tmp_path, "rack-a-01", trust="rogue-ca.pem")
            )

        # the right certificate still streams
        await streams(session, url, client_tls(tmp_path, "rack-a-01"), "rack-a-01")
        assert set(aggregator.by_host) == {"rack-a-01"}

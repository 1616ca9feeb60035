"""The agent's HTTP endpoint (on the metrics port): ``/metrics``, ``/healthz`` and the local control API.

``GET /api/v1/snapshot[?since=UNIX_TIME]`` returns the ring-buffer snapshot document (what
``sentinel agent snapshot`` prints); ``POST /api/v1/fr_dump[?job=ID]`` asks the local ranks to dump their
flight recorder; ``GET /api/v1/health`` is this node's fitness (what ``sentinel health`` asks, see
:mod:`sentinel.agent.health`). It binds to 127.0.0.1 by default: the control API is for the host's operator, the
aggregator reaches the same functions over its WebSocket. The handlers see the agent only through
:class:`LocalApi`. It is a small HTTP/1.1 server on ``asyncio.start_server`` (keep-alive, bounded request
size, connection count and idle time) rather than a web framework, which would be most of the agent's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import msgspec

from sentinel.agent.metrics import AgentCounters
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.families import CONTENT_TYPE_LATEST
from sentinel.log import get_logger
from sentinel.wire import FrDumpAnswer, Snapshot

log = get_logger(module="agent.http")

MAX_HEAD_BYTES = 8 * 1024
MAX_BODY_BYTES = 1024
MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0
JSON = "application/json; charset=utf-8"
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class LocalApi(Protocol):
    """What the local endpoint reads and asks of the agent."""

    @property
    def host(self) -> str: ...

    @property
    def counters(self) -> AgentCounters: ...

    @property
    def gpu_source(self) -> GpuSourceHealth | None: ...

    def render_metrics(self) -> bytes: ...

    def snapshot(self, since: float | None = None) -> Snapshot: ...

    def trigger_fr_dump(self, job: str | None = None) -> FrDumpAnswer: ...

    def health_report(self) -> dict[str, Any]: ...


class Response(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    content_type: str = JSON


def json_response(document: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(document).encode())


Handler = Callable[[dict[str, str]], Awaitable[Response]]


def routes(agent: LocalApi) -> dict[tuple[str, str], Handler]:
    """(method, path) → handler of the query parameters."""

    async def metrics(_: dict[str, str]) -> Response:
        body = agent.render_metrics()  # on the loop: it is short, and the state it reads is the loop's
        return Response(200, body, CONTENT_TYPE_LATEST)

    async def healthz(_: dict[str, str]) -> Response:
        # 503 while the GPU collector fails (NVML unusable, not open yet, re-initialising): a GPU host that
        # cannot see its GPUs is not healthy, however well the rest of the agent runs
        failing = [n for n, ok in agent.counters.collector_success.items() if not ok and n == "nvml"]
        body = {
            "ok": not failing,
            "host": agent.host,
            "last_tick": agent.counters.last_tick,
            "failing": failing,
        }
        if agent.gpu_source is not None and not agent.gpu_source.ok:
            body["gpu_source_error"] = agent.gpu_source.error
        return json_response(body, status=503 if failing else 200)

    async def snapshot(query: dict[str, str]) -> Response:
        raw = query.get("since")
        since: float | None = None
        if raw is not None:
            try:
                since = float(raw)
            except ValueError:
                since = math.nan
            if not math.isfinite(since):
                return json_response({"error": f"since: not a unix time: {raw[:64]!r}"}, status=400)
        return _struct_response(agent.snapshot(since))

    async def fr_dump(query: dict[str, str]) -> Response:
        job = query.get("job") or None
        return _struct_response(await asyncio.to_thread(agent.trigger_fr_dump, job))

    async def health(_: dict[str, str]) -> Response:
        return json_response(agent.health_report())

    return {
        ("GET", "/metrics"): metrics,
        ("GET", "/healthz"): healthz,
        ("GET", "/api/v1/snapshot"): snapshot,
        ("GET", "/api/v1/health"): health,
        ("POST", "/api/v1/fr_dump"): fr_dump,
    }


class HttpServer:
    """The listening socket and its connections; :meth:`cleanup` closes both."""

    def __init__(self, handlers: dict[tuple[str, str], Handler]) -> None:
        self.handlers = handlers
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[Any]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self.connections) >= MAX_CONNECTIONS or task is None:
            writer.close()
            return
        self.connections.add(task)
        try:
            keep_alive = True
            first = True
            while keep_alive:
                try:
                    async with asyncio.timeout(REQUEST_TIMEOUT_S if first else IDLE_TIMEOUT_S):
                        head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, TimeoutError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send(writer, Response(431, b"request head too large", "text/plain"), False)
                    return
                first = False
                keep_alive = await self._request(head, reader, writer)
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # one bad request must not take the endpoint down
            log.error("http_request_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self.connections.discard(task)
            writer.close()

    async def _request(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open for the next."""
        request_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, Response(400, b"bad request line", "text/plain"), False)
            return False
        method, target, version = parts
        fields: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                await self._send(writer, Response(400, b"bad header line", "text/plain"), False)
                return False
            fields[name.strip().lower()] = value.strip()
        connection = fields.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        if "transfer-encoding" in fields:
            await self._send(writer, Response(400, b"chunked bodies are not taken", "text/plain"), False)
            return False
        try:
            length = int(fields.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            await self._send(writer, Response(413, b"body too large", "text/plain"), False)
            return False
        if length:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await reader.readexactly(length)
        url = urlsplit(target)
        try:
            query = {k: v[0] for k, v in parse_qs(url.query, max_num_fields=16).items()}
        except ValueError:
            await self._send(writer, Response(400, b"too many query fields", "text/plain"), False)
            return False
        lookup = "GET" if method == "HEAD" else method
        handler = self.handlers.get((lookup, url.path))
        if handler is None:
            known = any(path == url.path for _, path in self.handlers)
            response = Response(405 if known else 404, b"", "text/plain")
        else:
            response = await handler(query)
        await self._send(writer, response, keep_alive, head_only=method == "HEAD")
        return keep_alive

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter, response: Response, keep_alive: bool, *, head_only: bool = False
    ) -> None:
        reason = REASONS.get(response.status, "")
        head = (
            f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") if head_only else head.encode("latin-1") + response.body)
        await writer.drain()

    async def cleanup(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        for task in list(self.connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.server is not None:
            await self.server.wait_closed()


async def start_http(agent: LocalApi, listen_host: str, listen_port: int) -> tuple[HttpServer, int]:
    """Serve on ``listen_host:listen_port``; returns the server (for cleanup) and the bound port."""
    http = HttpServer(routes(agent))
    http.server = await asyncio.start_server(http.serve, listen_host, listen_port, limit=MAX_HEAD_BYTES)
    sockets = http.server.sockets
    port = int(sockets[0].getsockname()[1]) if sockets else listen_port
    return http, port


def _struct_response(answer: msgspec.Struct) -> Response:
    """A typed answer as the JSON document the CLI prints (bytes as base64, as msgspec writes them)."""
    return Response(200, msgspec.json.encode(answer), "application/json")

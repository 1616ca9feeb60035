"""The agent's HTTP endpoint (on the metrics port): ``/metrics``, ``/healthz`` and the local control API.

``GET /api/v1/snapshot[?since=UNIX_TIME]`` returns the ring-buffer snapshot document (what
``sentinel agent snapshot`` prints); ``POST /api/v1/fr_dump[?job=ID]`` asks the local ranks to dump their
flight recorder; ``GET /api/v1/health`` is this node's fitness (what ``sentinel health`` asks, see
:mod:`sentinel.agent.health`). It binds to 127.0.0.1 by default: the control API is for the host's operator, the
aggregator reaches the same functions over its WebSocket. The handlers see the agent only through
:class:`LocalApi`.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Protocol

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from sentinel.agent.metrics import AgentCounters
from sentinel.components.device.record import GpuSourceHealth
from sentinel.wire import FrDumpAnswer, Snapshot


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


def build_app(agent: LocalApi) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = agent.render_metrics()  # on the loop: it is short, and the state it reads is the loop's
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
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
        return web.json_response(body, status=503 if failing else 200)

    async def snapshot(request: web.Request) -> web.Response:
        raw = request.query.get("since")
        since: float | None = None
        if raw is not None:
            try:
                since = float(raw)
            except ValueError:
                since = math.nan
            if not math.isfinite(since):
                return web.json_response({"error": f"since: not a unix time: {raw[:64]!r}"}, status=400)
        return _struct_response(agent.snapshot(since))

    async def fr_dump(request: web.Request) -> web.Response:
        job = request.query.get("job") or None
        return _struct_response(await asyncio.to_thread(agent.trigger_fr_dump, job))

    async def health(_: web.Request) -> web.Response:
        return web.json_response(agent.health_report())

    app = web.Application(client_max_size=1024)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/snapshot", snapshot)
    app.router.add_get("/api/v1/health", health)
    app.router.add_post("/api/v1/fr_dump", fr_dump)
    return app


async def start_http(agent: LocalApi, listen_host: str, listen_port: int) -> tuple[web.AppRunner, int]:
    """Serve on ``listen_host:listen_port``; returns the runner (for cleanup) and the bound port."""
    runner = web.AppRunner(build_app(agent), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, listen_host, listen_port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    port = listen_port
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    if sockets:
        port = int(sockets[0].getsockname()[1])
    return runner, port


def _struct_response(answer: msgspec.Struct) -> web.Response:
    """A typed answer as the JSON document the CLI prints (bytes as base64, as msgspec writes them)."""
    return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

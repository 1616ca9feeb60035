"""The aggregator's REST side: /healthz, /metrics, the paginated /api/v1 read API and its read token.

Every list is paginated (``server.api_page_size``), rendered in slices that give the event loop back to
ingest and encoded to JSON off the loop; /metrics is rendered one family at a time. With
``server.api_token_file`` set, ``/api/v1/`` (but the agents' stream) needs a read token.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.goodput import GoodputLedger
from sentinel.aggregator.identity import MAX_TOKEN_BYTES
from sentinel.aggregator.incidents import IncidentManager
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.aggregator.refusals import RefusalLog
from sentinel.aggregator.views import gpu_health, host_dict, job_detail, job_summary
from sentinel.config.aggregator import AggregatorConfig

_json = msgspec.json.Encoder()


class RestApi:
    """The HTTP handlers of the read API over the engine's state and the incident store."""

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        engine: Engine,
        incidents: IncidentManager,
        goodput: GoodputLedger,
        metrics: AggregatorMetrics,
        agents: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self.config = config  # replaced on reload (server stays)
        self.engine = engine
        self.incidents = incidents
        self.goodput = goodput
        self.metrics = metrics
        self.agents = agents
        self.clock = clock
        self.started_at = clock()

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "agents": self.agents(),
                "uptime_s": self.clock() - self.started_at,
                "cluster": self.config.fleet.cluster,
            }
        )

    async def metrics_endpoint(self, _: web.Request) -> web.Response:
        """The exposition, rendered one metric family at a time with the event loop resumed in between.

        At 6,144 hosts the per-host families (last seen, clock rate and offset) are ~18,000 series: rendered
        in one piece a scrape held the loop for 0.13-0.4 s, which every batch behind it waited for. The
        collectors compute each family from the engine's state in one go (no await inside a pass over the
        fleet), so each family is consistent; families may be up to a few milliseconds apart."""
        parts: list[bytes] = []
        for family in self.metrics.registry.collect():
            parts.append(generate_latest(_Families(family)))
            await asyncio.sleep(0)
        return web.Response(body=b"".join(parts), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _page(
        self, request: web.Request, key: str, items: Sequence[Any], render: Callable[[Any], Any]
    ) -> web.Response:
        """One page of ``items`` rendered, as ``{key: [...], total, offset, next_offset}``.

        The page is bounded (``server.api_page_size``), rendered in slices that give the event loop back to
        ingest between them, and encoded to JSON in a worker thread (what it encodes is no longer shared).
        """
        size = self.config.server.api_page_size
        try:
            limit = min(int(request.query.get("limit", size)), size)
            offset = int(request.query.get("offset", 0))
        except ValueError:
            raise web.HTTPBadRequest(text="limit and offset must be integers\n") from None
        if limit < 0 or offset < 0:
            raise web.HTTPBadRequest(text="limit and offset must not be negative\n")
        chosen = items[offset : offset + limit]
        out = []
        for index, item in enumerate(chosen):
            out.append(render(item))
            if index % 100 == 99:
                await asyncio.sleep(0)
        end = offset + len(out)
        document = {
            key: out,
            "total": len(items),
            "offset": offset,
            "next_offset": end if end < len(items) else None,
        }
        body = await asyncio.to_thread(_json.encode, document)
        return web.Response(body=body, content_type="application/json")

    async def verdicts(self, request: web.Request) -> web.Response:
        state = request.query.get("state")
        if state not in (None, "open", "closed"):
            raise web.HTTPBadRequest(text="state must be open or closed\n")
        return await self._page(request, "verdicts", self.engine.verdicts(state), lambda v: v.to_dict())

    async def jobs(self, request: web.Request) -> web.Response:
        jobs = list(self.engine.fleet.jobs.values())
        return await self._page(request, "jobs", jobs, lambda job: job_summary(self.engine, job))

    async def job(self, request: web.Request) -> web.Response:
        job = self.engine.fleet.jobs.get(request.match_info["id"])
        if job is None:
            raise web.HTTPNotFound(text="no such job\n")
        return _json_response(job_detail(self.engine, job, self.clock()))

    async def hosts(self, request: web.Request) -> web.Response:
        health, now = gpu_health(self.engine), self.clock()
        hosts = list(self.engine.fleet.hosts.values())
        return await self._page(request, "hosts", hosts, lambda h: host_dict(self.engine, h, now, health))

    async def incident_list(self, _: web.Request) -> web.Response:
        items = await asyncio.to_thread(self.incidents.list)
        return _json_response({"incidents": items})

    async def incident(self, request: web.Request) -> web.Response:
        incident_id = request.match_info["id"]
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", incident_id):
            raise web.HTTPNotFound(text="no such incident\n")
        found = await asyncio.to_thread(self.incidents.get, incident_id)
        if found is None:
            raise web.HTTPNotFound(text="no such incident\n")
        return _json_response(self.goodput.annotate(found, self.clock()))


class _Families:
    """One metric family as a registry (``generate_latest`` renders what ``collect`` returns)."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def read_token_middleware(refusals: RefusalLog, tokens: Sequence[bytes]) -> Any:
    """Requests under ``/api/v1/`` (but the agents' stream, which has its own tokens) need a read token."""

    @web.middleware
    async def require_read_token(request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if path.startswith("/api/v1/") and path != "/api/v1/stream":
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            given = token.strip().encode()[:MAX_TOKEN_BYTES]
            ok = False
            for accepted in tokens:
                ok |= hmac.compare_digest(given, accepted)
            if scheme.lower() != "bearer" or not ok:
                refusals.refused(
                    "api_unauthorized", "api_unauthorized", peer=request.remote or "?", path=path[:200]
                )
                raise web.HTTPUnauthorized(
                    text="this API needs a read token: Authorization: Bearer <token>\n",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        response: web.StreamResponse = await handler(request)
        return response

    return require_read_token


def _json_response(data: Any) -> web.Response:
    return web.Response(body=_json.encode(data), content_type="application/json")

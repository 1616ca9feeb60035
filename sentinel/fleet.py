"""The fleet read path: one view over several aggregators (one per cluster, or an HA pair per cluster).

Jobs never span clusters, so each aggregator owns its cluster's state and nothing is replicated between
them; a fleet answer is a merge of their REST answers at read time. :class:`FleetReader` asks every
aggregator at once with a bounded timeout and answer size, tags what comes back with its ``cluster`` (from
the aggregator's ``/healthz``) and ``source``, and folds the two aggregators of an HA pair into one: the
same open verdict (cluster, kind, host, gpu, job, rank, reason) from both is one entry with both sources and
the earlier ``opened_at``. An aggregator that does not answer is named under ``errors``; the rest is still
answered (a fleet view must not go blank because one cluster is down).

:func:`create_fleet_app` serves the merged answers at the aggregator's own paths (``/api/v1/verdicts``,
``hosts``, ``jobs``, ``incidents``, ``incidents/{id}``) with the status page at ``/``, so the page and
``sentinel incident --api`` work unchanged against a whole fleet (``sentinel fleet serve``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

#: one aggregator's answer is read up to this size (49,152 GPUs of /api/v1/hosts is ~15 MB)
MAX_ANSWER_BYTES = 64 << 20
#: open verdicts of an HA pair opened this close together are the same verdict seen twice
SAME_VERDICT_S = 30.0
_json = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


class FleetReader:
    """Concurrent, bounded reads of several aggregators' REST APIs, merged."""

    def __init__(self, urls: Sequence[str], *, timeout_s: float = 5.0) -> None:
        self.urls = [u.rstrip("/") for u in dict.fromkeys(urls)]
        self.timeout_s = timeout_s
        self.clusters: dict[str, str] = {}  # url -> cluster, learnt from /healthz
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> FleetReader:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def _get(self, url: str, path: str) -> tuple[int, Any]:
        """One answer; a paginated list answer (``next_offset``) with all its pages, within the size bound."""
        status, document = await self._get_page(url, path)
        pages = 1
        while isinstance(document, dict) and isinstance(document.get("next_offset"), int) and pages < 100:
            key = next((k for k, v in document.items() if isinstance(v, list)), None)
            if key is None:
                break
            sep = "&" if "?" in path else "?"
            _, more = await self._get_page(url, f"{path}{sep}offset={document['next_offset']}")
            if not isinstance(more, dict) or not isinstance(more.get(key), list):
                break
            document[key].extend(more[key])
            document["next_offset"] = more.get("next_offset")
            pages += 1
        return status, document

    async def _get_page(self, url: str, path: str) -> tuple[int, Any]:
        async with self._client().get(url + path) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_chunked(1 << 20):
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ValueError(f"answer larger than {MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
            body = b"".join(chunks)
            if response.status == 404:
                return 404, None
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            return 200, _json.decode(body)

    async def _cluster(self, url: str) -> str:
        known = self.clusters.get(url)
        if known is None:
            _, health = await self._get(url, "/healthz")
            known = self.clusters[url] = (
                str(health.get("cluster") or url) if isinstance(health, dict) else url
            )
        return known

    async def gather(self, path: str) -> tuple[list[tuple[str, str, Any]], list[dict[str, str]]]:
        """``(url, cluster, answer)`` of every aggregator that answered 200, and the errors of the others."""

        async def one(url: str) -> tuple[str, str, Any]:
            cluster = await self._cluster(url)
            status, answer = await self._get(url, path)
            return url, cluster, answer if status == 200 else None

        results = await asyncio.gather(*(one(url) for url in self.urls), return_exceptions=True)
        answers: list[tuple[str, str, Any]] = []
        errors: list[dict[str, str]] = []
        for url, result in zip(self.urls, results, strict=True):
            if isinstance(result, BaseException):
                errors.append({"url": url, "error": f"{type(result).__name__}: {result}"[:300]})
            elif result[2] is not None:
                answers.append(result)
        return answers, errors

    # -- merged answers -------------------------------------------------------------------------------

    async def verdicts(self, state: str | None = None) -> dict[str, Any]:
        path = "/api/v1/verdicts" + (f"?state={state}" if state else "")
        answers, errors = await self.gather(path)
        items = [
            {**v, "cluster": cluster, "source": url, "id": f"{cluster}/{v.get('id')}"}
            for url, cluster, answer in answers
            for v in answer.get("verdicts", [])
            if isinstance(v, dict)
        ]
        return {"verdicts": merge_verdicts(items), "errors": errors}

    async def hosts(self) -> dict[str, Any]:
        answers, errors = await self.gather("/api/v1/hosts")
        best: dict[tuple[str, str], dict[str, Any]] = {}
        for url, cluster, answer in answers:
            for host in answer.get("hosts", []):
                if not isinstance(host, dict):
                    continue
                key = (cluster, str(host.get("name")))
                item = {**host, "cluster": cluster, "source": url}
                known = best.get(key)
                if known is None or _fresher(item, known):
                    best[key] = item
        return {"hosts": list(best.values()), "errors": errors}

    async def jobs(self) -> dict[str, Any]:
        answers, errors = await self.gather("/api/v1/jobs")
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for url, cluster, answer in answers:
            for job in answer.get("jobs", []):
                if isinstance(job, dict):
                    seen.setdefault((cluster, str(job.get("id"))), {**job, "cluster": cluster, "source": url})
        return {"jobs": list(seen.values()), "errors": errors}

    async def job(self, job_id: str) -> dict[str, Any] | None:
        return await self._first(f"/api/v1/jobs/{job_id}")

    async def incidents(self) -> dict[str, Any]:
        answers, errors = await self.gather("/api/v1/incidents")
        items = [
            {**i, "cluster": cluster, "source": url}
            for url, cluster, answer in answers
            for i in answer.get("incidents", [])
            if isinstance(i, dict)
        ]
        items.sort(key=lambda i: float(i.get("created_at") or 0.0), reverse=True)
        return {"incidents": items, "errors": errors}

    async def incident(self, incident_id: str) -> dict[str, Any] | None:
        return await self._first(f"/api/v1/incidents/{incident_id}")

    async def _first(self, path: str) -> dict[str, Any] | None:
        """The first aggregator's answer that is not a 404 (incident and job ids name one cluster)."""
        answers, _ = await self.gather(path)
        for url, cluster, answer in answers:
            if isinstance(answer, dict):
                return {**answer, "cluster": cluster, "source": url}
        return None


def _fresher(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (bool(a.get("connected")), float(a.get("last_seen") or 0.0)) > (
        bool(b.get("connected")),
        float(b.get("last_seen") or 0.0),
    )


def merge_verdicts(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold the copies an HA pair makes of one verdict: same cluster and subject, state, opened within
    :data:`SAME_VERDICT_S` of each other. The earliest copy is kept, with every ``source``."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for item in items:
        key = tuple(item.get(k) for k in ("cluster", "kind", "host", "gpu", "job", "rank", "reason", "state"))
        groups.setdefault(key, []).append(item)
    out: list[dict[str, Any]] = []
    for copies in groups.values():
        copies.sort(key=lambda v: float(v.get("opened_at") or 0.0))
        kept: list[dict[str, Any]] = []
        for item in copies:
            last = kept[-1] if kept else None
            opened = float(item.get("opened_at") or 0.0)
            if last is not None and opened - float(last.get("opened_at") or 0.0) <= SAME_VERDICT_S:
                if item["source"] not in last["sources"]:
                    last["sources"].append(item["source"])
                continue
            kept.append({**item, "sources": [item["source"]]})
        out.extend(kept)
    out.sort(key=lambda v: float(v.get("opened_at") or 0.0))
    return out


# -- the fleet API server -------------------------------------------------------------------------------

READER_KEY: web.AppKey[FleetReader] = web.AppKey("sentinel_fleet_reader", FleetReader)
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,256}")


def _answer(data: Any) -> web.Response:
    return web.Response(body=_encode.encode(data), content_type="application/json")


def create_fleet_app(
    urls: Sequence[str], *, timeout_s: float = 5.0, status_page: bool = True
) -> web.Application:
    """The merged fleet API at the aggregator's paths (plus the status page at ``/``)."""
    reader = FleetReader(urls, timeout_s=timeout_s)
    app = web.Application()
    app[READER_KEY] = reader
    started = time.time()

    async def healthz(_: web.Request) -> web.Response:
        return _answer({"status": "ok", "aggregators": reader.urls, "uptime_s": time.time() - started})

    async def verdicts(request: web.Request) -> web.Response:
        state = request.query.get("state")
        if state not in (None, "open", "closed"):
            raise web.HTTPBadRequest(text="state must be open or closed\n")
        return _answer(await reader.verdicts(state))

    async def hosts(_: web.Request) -> web.Response:
        return _answer(await reader.hosts())

    async def jobs(_: web.Request) -> web.Response:
        return _answer(await reader.jobs())

    def one(find: Any, what: str) -> Any:
        """A handler for ``.../{id}``: the first aggregator that knows the id answers."""

        async def handler(request: web.Request) -> web.Response:
            item_id = request.match_info["id"]
            found = await find(item_id) if _ID.fullmatch(item_id) else None
            if found is None:
                raise web.HTTPNotFound(text=f"no such {what}\n")
            return _answer(found)

        return handler

    async def incidents(_: web.Request) -> web.Response:
        return _answer(await reader.incidents())

    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/api/v1/verdicts", verdicts),
            web.get("/api/v1/hosts", hosts),
            web.get("/api/v1/jobs", jobs),
            web.get("/api/v1/jobs/{id}", one(reader.job, "job")),
            web.get("/api/v1/incidents", incidents),
            web.get("/api/v1/incidents/{id}", one(reader.incident, "incident")),
        ]
    )
    if status_page:
        from sentinel.web import add_status_page

        add_status_page(app)

    async def on_cleanup(_: web.Application) -> None:
        await reader.close()

    app.on_cleanup.append(on_cleanup)
    return app

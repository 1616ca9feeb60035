"""The fleet read path: one view over several aggregators (one per cluster, or an HA pair per cluster).

Jobs never span clusters, so each aggregator owns its cluster's state and nothing is replicated between
them; a fleet answer is a merge of their REST answers at read time. :class:`FleetReader` asks every
aggregator at once, tags what comes back with its ``cluster`` (from the aggregator's ``/healthz``) and
``source``, and folds the two aggregators of an HA pair into one: the same open verdict (cluster, kind, host,
gpu, job, rank, reason) from both is one entry with both sources and the earlier ``opened_at``.

Each aggregator is read within bounds: one deadline for the whole read (``/healthz`` and every page), a byte
budget for the whole read and one per page, a page count, offsets that must move forward. Every field the
merge reads is type-checked (:class:`VerdictFields` and its kin, msgspec); the rest of an item is passed
through as it came. An aggregator that does not answer in time is named under ``errors`` as
``unreachable``, one whose answer breaks a bound or a type as ``invalid``, each with a one-line reason; the
others are still merged (a fleet view must not go blank because one cluster is down or lies).

:func:`create_fleet_app` serves the merged answers at the aggregator's own paths (``/api/v1/verdicts``,
``hosts``, ``jobs``, ``incidents``, ``incidents/{id}``) with the status page at ``/``, so the page and
``sentinel incident --api`` work unchanged against a whole fleet (``sentinel fleet serve``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

import aiohttp
import msgspec
from aiohttp import web

#: one page of an aggregator's answer is read up to this size
MAX_PAGE_BYTES = 16 << 20
#: all pages of one aggregator's answer to one read, /healthz included, up to this size
MAX_READ_BYTES = 64 << 20
#: pages followed per answer at most (49,152 GPUs of /api/v1/hosts is ~15 MB)
MAX_PAGES = 100
#: open verdicts of an HA pair opened this close together are the same verdict seen twice
SAME_VERDICT_S = 30.0
_json = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()
T = TypeVar("T")
Text = Annotated[str, msgspec.Meta(max_length=4096)]


class HealthFields(msgspec.Struct):
    """What the reader uses of an aggregator's ``/healthz``."""

    cluster: Annotated[str, msgspec.Meta(max_length=256)] = ""


class VerdictFields(msgspec.Struct):
    """The fields of a verdict the merge reads (the rest of the item passes through unread)."""

    id: Text | int | None = None
    kind: Text | None = None
    host: Text | None = None
    gpu: int | None = None
    job: Text | None = None
    rank: int | None = None
    reason: Text | None = None
    state: Text | None = None
    opened_at: float | None = None


class HostFields(msgspec.Struct):
    name: Text
    connected: bool | None = None
    last_seen: float | None = None


class JobFields(msgspec.Struct):
    id: Text | int


class IncidentFields(msgspec.Struct):
    created_at: float | None = None


class AggregatorUnreachable(Exception):
    """The aggregator did not answer (connection, HTTP status, deadline)."""


class AggregatorInvalid(Exception):
    """The aggregator answered something outside the bounds or the types the reader accepts."""


class _Budget:
    """The bytes one aggregator's read may still take."""

    def __init__(self, total: int, per_page: int) -> None:
        self.left = total
        self.total = total
        self.per_page = per_page


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def check_page(document: Any, key: str, fields: type[Any]) -> tuple[list[dict[str, Any]], int | None]:
    """A list page's items (each an object whose read fields have the right types) and its
    ``next_offset``; :class:`AggregatorInvalid` naming the first thing wrong."""
    if not isinstance(document, dict):
        raise AggregatorInvalid(f"answer is a {type(document).__name__}, not an object")
    items = document.get(key)
    if not isinstance(items, list):
        raise AggregatorInvalid(f"{key!r} is {type(items).__name__}, not a list")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise AggregatorInvalid(f"{key}[{index}] is a {type(item).__name__}, not an object")
        try:
            msgspec.convert(item, fields)
        except msgspec.ValidationError as exc:
            raise AggregatorInvalid(f"{key}[{index}]: {_one_line(str(exc), 200)}") from None
    next_offset = document.get("next_offset")
    if next_offset is not None and (type(next_offset) is not int or next_offset < 0):
        raise AggregatorInvalid(f"next_offset is {next_offset!r:.40}, not an offset")
    return items, next_offset


class FleetReader:
    """Concurrent, bounded reads of several aggregators' REST APIs, merged."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 5.0,
        max_read_bytes: int = MAX_READ_BYTES,
        max_page_bytes: int = MAX_PAGE_BYTES,
        max_pages: int = MAX_PAGES,
    ) -> None:
        self.urls = [u.rstrip("/") for u in dict.fromkeys(urls)]
        self.timeout_s = timeout_s
        self.max_read_bytes = max_read_bytes
        self.max_page_bytes = max_page_bytes
        self.max_pages = max_pages
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

    async def _get_page(self, url: str, path: str, budget: _Budget) -> Any:
        """One page decoded (None: 404), within the page bound and what is left of the read's budget."""
        limit = min(budget.per_page, budget.left)
        try:
            async with self._client().get(url + path, allow_redirects=False) as response:
                if response.status == 404:
                    return None
                if response.status != 200:
                    raise AggregatorUnreachable(f"HTTP {response.status} for {path}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(1 << 20):
                    size += len(chunk)
                    if size > limit:
                        raise AggregatorInvalid(
                            f"{path}: answer larger than {limit} bytes (page bound {budget.per_page}, "
                            f"{budget.total} bytes per read)"
                        )
                    chunks.append(chunk)
        except (aiohttp.ClientError, OSError) as exc:
            raise AggregatorUnreachable(f"{type(exc).__name__}: {exc}") from None
        budget.left -= size
        try:
            return _json.decode(b"".join(chunks))
        except msgspec.DecodeError as exc:
            raise AggregatorInvalid(f"{path}: not JSON: {exc}") from None

    async def _list(self, url: str, path: str, key: str, fields: type[Any], budget: _Budget) -> list[Any]:
        """Every item of a paginated list answer (``next_offset``), each checked; [] for a 404."""
        document = await self._get_page(url, path, budget)
        if document is None:
            return []
        items, next_offset = check_page(document, key, fields)
        pages, offset = 1, 0
        while next_offset is not None:
            if pages >= self.max_pages:
                raise AggregatorInvalid(f"{path}: more than {self.max_pages} pages")
            if next_offset <= offset:
                raise AggregatorInvalid(f"{path}: next_offset {next_offset} does not move past {offset}")
            offset = next_offset
            sep = "&" if "?" in path else "?"
            more = await self._get_page(url, f"{path}{sep}offset={offset}", budget)
            if more is None:
                raise AggregatorInvalid(f"{path}: page at offset {offset} is gone")
            page, next_offset = check_page(more, key, fields)
            items.extend(page)
            pages += 1
        return items

    async def _object(self, url: str, path: str, budget: _Budget) -> dict[str, Any] | None:
        document = await self._get_page(url, path, budget)
        if document is not None and not isinstance(document, dict):
            raise AggregatorInvalid(f"{path}: answer is a {type(document).__name__}, not an object")
        return document

    async def _cluster(self, url: str, budget: _Budget) -> str:
        known = self.clusters.get(url)
        if known is None:
            health = await self._object(url, "/healthz", budget)
            try:
                cluster = msgspec.convert(health or {}, HealthFields).cluster
            except msgspec.ValidationError as exc:
                raise AggregatorInvalid(f"/healthz: {_one_line(str(exc), 200)}") from None
            known = self.clusters[url] = cluster or url
        return known

    async def _each(
        self, read: Callable[[str, _Budget], Awaitable[T]]
    ) -> tuple[list[tuple[str, str, T]], list[dict[str, str]]]:
        """``read`` of every aggregator at once, each within the deadline and its own byte budget:
        ``(url, cluster, answer)`` of those that answered, an error with a one-line reason for the others."""

        async def one(url: str) -> tuple[str, str, T]:
            budget = _Budget(self.max_read_bytes, self.max_page_bytes)
            try:
                async with asyncio.timeout(self.timeout_s):
                    cluster = await self._cluster(url, budget)
                    return url, cluster, await read(url, budget)
            except TimeoutError:
                raise AggregatorUnreachable(f"no complete answer within {self.timeout_s:g} s") from None

        results = await asyncio.gather(*(one(url) for url in self.urls), return_exceptions=True)
        answers: list[tuple[str, str, T]] = []
        errors: list[dict[str, str]] = []
        for url, result in zip(self.urls, results, strict=True):
            if isinstance(result, AggregatorInvalid):
                errors.append({"url": url, "kind": "invalid", "error": _one_line(str(result))})
            elif isinstance(result, AggregatorUnreachable):
                errors.append({"url": url, "kind": "unreachable", "error": _one_line(str(result))})
            elif isinstance(result, Exception):
                errors.append(
                    {
                        "url": url,
                        "kind": "unreachable",
                        "error": _one_line(f"{type(result).__name__}: {result}"),
                    }
                )
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        return answers, errors

    async def gather(
        self, path: str, key: str, fields: type[Any]
    ) -> tuple[list[tuple[str, str, list[dict[str, Any]]]], list[dict[str, str]]]:
        """Every aggregator's list answer at ``path`` (all pages, each item checked against ``fields``)."""

        async def read(url: str, budget: _Budget) -> list[dict[str, Any]]:
            return await self._list(url, path, key, fields, budget)

        return await self._each(read)

    # -- merged answers -------------------------------------------------------------------------------

    async def verdicts(self, state: str | None = None) -> dict[str, Any]:
        path = "/api/v1/verdicts" + (f"?state={state}" if state else "")
        answers, errors = await self.gather(path, "verdicts", VerdictFields)
        items = [
            {**v, "cluster": cluster, "source": url, "id": f"{cluster}/{v.get('id')}"}
            for url, cluster, answer in answers
            for v in answer
        ]
        return {"verdicts": merge_verdicts(items), "errors": errors}

    async def hosts(self) -> dict[str, Any]:
        answers, errors = await self.gather("/api/v1/hosts", "hosts", HostFields)
        best: dict[tuple[str, str], dict[str, Any]] = {}
        for url, cluster, answer in answers:
            for host in answer:
                key = (cluster, str(host.get("name")))
                item = {**host, "cluster": cluster, "source": url}
                known = best.get(key)
                if known is None or _fresher(item, known):
                    best[key] = item
        return {"hosts": list(best.values()), "errors": errors}

    async def jobs(self) -> dict[str, Any]:
        answers, errors = await self.gather("/api/v1/jobs", "jobs", JobFields)
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for url, cluster, answer in answers:
            for job in answer:
                seen.setdefault((cluster, str(job.get("id"))), {**job, "cluster": cluster, "source": url})
        return {"jobs": list(seen.values()), "errors": errors}

    async def job(self, job_id: str) -> dict[str, Any] | None:
        return await self._first(f"/api/v1/jobs/{job_id}")

    async def incidents(self) -> dict[str, Any]:
        answers, errors = await self.gather("/api/v1/incidents", "incidents", IncidentFields)
        items = [{**i, "cluster": cluster, "source": url} for url, cluster, answer in answers for i in answer]
        items.sort(key=lambda i: float(i.get("created_at") or 0.0), reverse=True)
        return {"incidents": items, "errors": errors}

    async def incident(self, incident_id: str) -> dict[str, Any] | None:
        return await self._first(f"/api/v1/incidents/{incident_id}")

    async def _first(self, path: str) -> dict[str, Any] | None:
        """The first aggregator's answer that is not a 404 (incident and job ids name one cluster)."""

        async def read(url: str, budget: _Budget) -> dict[str, Any] | None:
            return await self._object(url, path, budget)

        answers, _ = await self._each(read)
        for url, cluster, answer in answers:
            if answer is not None:
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

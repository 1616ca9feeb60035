"""The demo's window on the aggregator: polls its REST API (contract section 5) like any operator tool would.

Each :meth:`ApiWatcher.poll` reads ``/api/v1/verdicts``, ``/api/v1/jobs`` and ``/api/v1/hosts`` over HTTP on
127.0.0.1 and returns a :class:`~sentinel.demo.model.Snapshot`. Verdicts are remembered across polls (a
verdict that opened and closed between two polls still counts). A failed poll returns the last snapshot
marked unreachable; the demo keeps going. The JSON readers accept a bare list or an object holding the list,
and a few spellings of each field, so the view does not break on an additive API change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from sentinel.demo.model import JobView, Snapshot
from sentinel.demo.outcome import ApiShapeError, Verdict, verdict_from_api

# loggers are looked up when used, not at import: a logger bound at import time keeps structlog's
# configuration of that moment and would ignore the demo's setup_logging
from sentinel.log import get_logger

MAX_VERDICTS = 100_000  # bound on remembered verdicts (a demo opens a handful)
_DOWN_STATES = frozenset({"silent", "down", "disconnected", "offline", "lost"})


def as_list(payload: Any, key: str) -> list[Any]:
    """``[...]`` or ``{key: [...]}`` (or ``items``/``data``) → the list; anything else → []."""
    if isinstance(payload, list):
        return payload
    if isinstance(payload, Mapping):
        for k in (key, "items", "data"):
            value = payload.get(k)
            if isinstance(value, list):
                return value
    return []


def _int_or_len(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list | dict):
        return len(value)
    return None


def job_from_api(obj: Any) -> JobView | None:
    if not isinstance(obj, Mapping):
        return None
    job_id = obj.get("id", obj.get("job", obj.get("job_id")))
    if job_id is None:
        return None
    state = obj.get("state", obj.get("status"))
    if not isinstance(state, str) or not state:
        open_verdicts = obj.get("open_verdicts")
        if obj.get("stalled"):
            state = "stalled"
        elif isinstance(open_verdicts, int) and not isinstance(open_verdicts, bool) and open_verdicts > 0:
            state = "degraded"
        else:
            state = "running"
    ranks = _int_or_len(obj.get("ranks", obj.get("world_size")))
    hosts = _int_or_len(obj.get("hosts", obj.get("host_count")))
    return JobView(id=str(job_id), state=state, ranks=ranks, hosts=hosts)


def host_from_api(obj: Any) -> tuple[str, bool, dict[int, str]] | None:
    """(name, connected, {gpu index: raw state}) of one host object."""
    if not isinstance(obj, Mapping):
        return None
    name = obj.get("host", obj.get("name", obj.get("id")))
    if name is None:
        return None
    connected = True
    for key in ("connected", "alive"):
        if isinstance(obj.get(key), bool):
            connected = bool(obj[key])
            break
    else:
        state = obj.get("state")
        if isinstance(state, str):
            connected = state not in _DOWN_STATES
    gpus: dict[int, str] = {}
    raw_gpus = obj.get("gpus")
    if isinstance(raw_gpus, list):
        for i, gpu in enumerate(raw_gpus):
            if isinstance(gpu, Mapping):
                index = gpu.get("index", gpu.get("gpu", i))
                if isinstance(index, int) and not isinstance(index, bool):
                    gpus[index] = str(gpu.get("state") or "ok")
    return str(name), connected, gpus


class ApiWatcher:
    """Polls one aggregator; ``started_at`` is the demo's t=0 (unix seconds)."""

    def __init__(
        self,
        base_url: str,
        started_at: float,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 5.0,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._started_at = started_at
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._verdicts: dict[str, Verdict] = {}
        self._last = Snapshot(t_s=0.0, reachable=False)
        self._shape_errors: set[str] = set()

    async def __aenter__(self) -> ApiWatcher:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def verdicts(self) -> list[Verdict]:
        return list(self._verdicts.values())

    async def _get(self, path: str) -> Any:
        """A list answer with every page (the API pages at ``server.api_page_size``), at most 100 pages."""
        assert self._session is not None, "use ApiWatcher as an async context manager"
        key = path.rsplit("/", 1)[-1]
        items: list[Any] = []
        offset: Any = 0
        for _ in range(100):
            async with self._session.get(self._base + path, params={"offset": str(offset)}) as resp:
                resp.raise_for_status()
                document = await resp.json(content_type=None)
            if not isinstance(document, dict):
                return document
            items.extend(as_list(document, key))
            offset = document.get("next_offset")
            if not isinstance(offset, int):
                break
        return {key: items}

    def _shape_error(self, what: str, exc: Exception) -> None:
        key = f"{what}: {exc}"
        if key not in self._shape_errors and len(self._shape_errors) < 100:
            self._shape_errors.add(key)
            get_logger(module="demo.watch").warning("unreadable api object", what=what, error=str(exc))

    async def poll(self) -> Snapshot:
        now = self._clock()
        t_s = now - self._started_at
        try:
            verdicts, jobs, hosts = await asyncio.gather(
                self._get("/api/v1/verdicts"), self._get("/api/v1/jobs"), self._get("/api/v1/hosts")
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            get_logger(module="demo.watch").debug("aggregator poll failed", error=str(exc))
            self._last = Snapshot(
                t_s=t_s,
                jobs=self._last.jobs,
                hosts_seen=self._last.hosts_seen,
                hosts_down=self._last.hosts_down,
                gpu_raw=self._last.gpu_raw,
                verdicts=self.verdicts,
                reachable=False,
            )
            return self._last
        for obj in as_list(verdicts, "verdicts"):
            try:
                verdict = verdict_from_api(obj, self._started_at, now)
            except ApiShapeError as exc:
                self._shape_error("verdict", exc)
                continue
            if verdict.id in self._verdicts or len(self._verdicts) < MAX_VERDICTS:
                self._verdicts[verdict.id] = verdict
        job_views = [j for j in (job_from_api(o) for o in as_list(jobs, "jobs")) if j is not None]
        seen: set[str] = set()
        down: set[str] = set()
        raw: dict[tuple[str, int], str] = {}
        for obj in as_list(hosts, "hosts"):
            host = host_from_api(obj)
            if host is None:
                continue
            name, connected, gpus = host
            seen.add(name)
            if not connected:
                down.add(name)
            for index, state in gpus.items():
                raw[(name, index)] = state
        self._last = Snapshot(
            t_s=t_s,
            jobs=sorted(job_views, key=lambda j: j.id),
            hosts_seen=frozenset(seen),
            hosts_down=frozenset(down),
            gpu_raw=raw,
            verdicts=self.verdicts,
            reachable=True,
        )
        return self._last

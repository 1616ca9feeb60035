"""The fleet reader against aggregators that lie: endless or huge pages, pages that never end, odd types,
lists where objects belong, offsets that do not move, answers that trickle. Each such aggregator is named
``invalid`` or ``unreachable`` with a one-line reason while the honest one is still merged; the page checker
is fuzzed with answers of the right shape and the wrong types."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.fleet import (
    AggregatorInvalid,
    FleetReader,
    HostFields,
    IncidentFields,
    VerdictFields,
    _fresher,
    check_page,
    merge_verdicts,
)

Handler = Callable[[web.Request], Any]
GOOD_VERDICT = {
    "id": "v000001",
    "kind": "faulty",
    "host": "h1",
    "gpu": 2,
    "job": None,
    "rank": None,
    "reason": "xid_79",
    "state": "open",
    "opened_at": 100.0,
}


@asynccontextmanager
async def aggregator(cluster: str, verdicts: Handler) -> AsyncIterator[str]:
    """A real HTTP server on 127.0.0.1 with the aggregator's /healthz and a /api/v1/verdicts of our making."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "cluster": cluster})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/api/v1/verdicts", verdicts)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def json_handler(document: Any) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=msgspec.json.encode(document), content_type="application/json")

    return handler


async def read_with(bad: Handler, **bounds: Any) -> dict[str, Any]:
    async with (
        aggregator("good", json_handler({"verdicts": [GOOD_VERDICT], "next_offset": None})) as good,
        aggregator("bad", bad) as bad_url,
        FleetReader([good, bad_url], **bounds) as reader,
    ):
        answer = await reader.verdicts()
    assert [(v["cluster"], v["host"], v["gpu"]) for v in answer["verdicts"]] == [("good", "h1", 2)]
    (error,) = answer["errors"]
    assert error["url"] == bad_url and "\n" not in error["error"]
    return dict(error)


async def test_endless_large_pages_stop_at_the_read_budget() -> None:
    """The attack: 100 pages of 64 MiB from one aggregator. Now the whole read has one byte budget."""
    served = []

    async def endless(request: web.Request) -> web.Response:
        offset = int(request.query.get("offset", "0"))
        served.append(offset)
        page = {"verdicts": [{**GOOD_VERDICT, "id": f"v{offset + i}"} for i in range(1000)]}
        return web.Response(
            body=msgspec.json.encode({**page, "next_offset": offset + 1000}), content_type="application/json"
        )

    error = await read_with(endless, max_read_bytes=1 << 20, max_page_bytes=512 << 10)
    assert error["kind"] == "invalid" and "larger than" in error["error"]
    assert len(served) < 10  # ~190 kB a page: the budget of 1 MiB ends it after a few


async def test_one_huge_page_stops_at_the_page_bound() -> None:
    huge = {"verdicts": [GOOD_VERDICT] * 20000, "next_offset": None}
    error = await read_with(json_handler(huge), max_page_bytes=256 << 10)
    assert error["kind"] == "invalid" and f"page bound {256 << 10}" in error["error"]


async def test_pages_that_never_end_stop_at_the_page_count() -> None:
    async def forever(request: web.Request) -> web.Response:
        offset = int(request.query.get("offset", "0"))
        return web.json_response({"verdicts": [], "next_offset": offset + 1})

    error = await read_with(forever, max_pages=7)
    assert error == {"url": error["url"], "kind": "invalid", "error": "/api/v1/verdicts: more than 7 pages"}


async def test_an_offset_that_does_not_move_is_invalid() -> None:
    error = await read_with(json_handler({"verdicts": [], "next_offset": 0}))
    assert error["kind"] == "invalid" and "does not move" in error["error"]


async def test_a_trickling_aggregator_is_cut_at_the_deadline() -> None:
    async def slow_pages(request: web.Request) -> web.Response:
        offset = int(request.query.get("offset", "0"))
        await asyncio.sleep(0.2)  # each page in time for a per-request timeout, the whole read not
        return web.json_response({"verdicts": [], "next_offset": offset + 1})

    error = await read_with(slow_pages, timeout_s=1.0)
    assert error == {"url": error["url"], "kind": "unreachable", "error": "no complete answer within 1 s"}


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ({"verdicts": [{**GOOD_VERDICT, "opened_at": "yesterday"}]}, "verdicts[0]: Expected `float | null`"),
        ({"verdicts": [[1, 2]]}, "verdicts[0] is a list, not an object"),
        ({"verdicts": {"0": GOOD_VERDICT}}, "'verdicts' is dict, not a list"),
        ([GOOD_VERDICT], "answer is a list, not an object"),
        ({"verdicts": [{**GOOD_VERDICT, "gpu": True}]}, "verdicts[0]: Expected `int | null`, got `bool`"),
        ({"verdicts": [], "next_offset": "10"}, "next_offset is '10', not an offset"),
    ],
)
async def test_odd_types_name_the_aggregator_invalid_and_the_rest_merges(document: Any, reason: str) -> None:
    error = await read_with(json_handler(document))
    assert error["kind"] == "invalid" and reason in error["error"]


async def test_not_json_is_invalid() -> None:
    async def garbage(_: web.Request) -> web.Response:
        return web.Response(body=b'{"verdicts": [', content_type="application/json")

    error = await read_with(garbage)
    assert error["kind"] == "invalid" and "not JSON" in error["error"]


# -- fuzz: answers of the right shape with odd types ---------------------------------------------------------

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _item(keys: list[str]) -> st.SearchStrategy[Any]:
    fields = st.fixed_dictionaries({}, optional=dict.fromkeys(keys, ODD))
    return st.one_of(fields, fields, fields, ODD)


def _page(key: str, keys: list[str]) -> st.SearchStrategy[Any]:
    page = st.fixed_dictionaries(
        {key: st.one_of(st.lists(_item(keys), max_size=6), ODD)},
        optional={"next_offset": ODD, "total": ODD},
    )
    return st.one_of(page, page, page, ODD)


VERDICT_KEYS = ["id", "kind", "host", "gpu", "job", "rank", "reason", "state", "opened_at"]


@settings(max_examples=400, deadline=None)
@given(st.lists(_page("verdicts", VERDICT_KEYS), min_size=1, max_size=3))
def test_verdict_pages_are_checked_or_refused_and_what_passes_merges(pages: list[Any]) -> None:
    items: list[dict[str, Any]] = []
    for n, document in enumerate(pages):
        try:
            page, next_offset = check_page(document, "verdicts", VerdictFields)
        except AggregatorInvalid as exc:
            assert "\n" not in str(exc)
            continue
        assert next_offset is None or (type(next_offset) is int and next_offset >= 0)
        items.extend({**v, "cluster": f"c{n % 2}", "source": f"s{n}"} for v in page)
    merged = merge_verdicts(items)
    assert sum(len(v["sources"]) for v in merged) <= len(items)
    msgspec.json.encode(merged)


@settings(max_examples=300, deadline=None)
@given(_page("hosts", ["name", "connected", "last_seen"]), _page("incidents", ["created_at", "id"]))
def test_host_and_incident_pages_are_checked_or_refused(hosts: Any, incidents: Any) -> None:
    try:
        page, _ = check_page(hosts, "hosts", HostFields)
    except AggregatorInvalid:
        page = []
    for a in page:
        for b in page:
            _fresher(a, b)
    try:
        found, _ = check_page(incidents, "incidents", IncidentFields)
    except AggregatorInvalid:
        found = []
    sorted(found, key=lambda i: float(i.get("created_at") or 0.0))

"""The status page's routes on an aiohttp application."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from pytest_aiohttp import AiohttpClient

from sentinel.components.vocab import VERDICT_KINDS
from sentinel.config.aggregator import AggregatorConfig
from sentinel.web import ASSETS, DEFAULT_RUNBOOK_BASE, add_status_page
from sentinel.web.runbooks import GENERAL_RUNBOOK, RUNBOOK_OF_KIND, RUNBOOK_OF_REASON_PREFIX, runbook_for


async def test_status_page_routes(aiohttp_client: AiohttpClient) -> None:
    app = web.Application()
    add_status_page(app)
    client = await aiohttp_client(app)
    index = await client.get("/")
    assert index.status == 200
    assert index.content_type == "text/html"
    html = await index.text()
    assert 'src="ui/app.js"' in html and 'href="ui/style.css"' in html
    for name, ctype in ASSETS.items():
        resp = await client.get(f"/ui/{name}")
        assert resp.status == 200, name
        assert resp.content_type == ctype
        assert resp.headers["Cache-Control"] == "no-cache"
    script = await (await client.get("/ui/app.js")).text()
    # the page reads the contract's API and never writes API data as HTML
    for path in ("api/v1/verdicts", "api/v1/jobs", "api/v1/hosts", "api/v1/incidents"):
        assert path in script
    assert "innerHTML" not in script
    for bad in ("/ui/../__init__.py", "/ui/%2e%2e%2f__init__.py", "/ui/nope.js", "/ui/"):
        assert (await client.get(bad)).status == 404, bad


RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"


def test_every_runbook_the_page_can_link_exists() -> None:
    named = {name for _, name in RUNBOOK_OF_REASON_PREFIX} | set(RUNBOOK_OF_KIND.values()) | {GENERAL_RUNBOOK}
    missing = sorted(name for name in named if not (RUNBOOKS / name).is_file())
    assert missing == []
    assert set(RUNBOOK_OF_KIND) == set(VERDICT_KINDS)  # every kind has its own runbook


def test_a_verdict_links_the_runbook_of_its_signal() -> None:
    assert runbook_for("faulty", "gpu_lost") == "SentinelGpuLost.md"
    assert runbook_for("faulty", "row_remap_failure") == "SentinelGpuRowRemapFailed.md"
    assert runbook_for("degraded", "row_remap_pending") == "SentinelGpuRowRemapPending.md"
    assert runbook_for("faulty", "xid_79") == "SentinelGpuCriticalXid.md"
    assert runbook_for("degraded", "ib_link_flap") == "SentinelIbLinkFlapping.md"
    assert runbook_for("stuck", "not_entered_collective") == "SentinelJobStalled.md"
    assert runbook_for("straggler", "slow_compute") == "SentinelStraggler.md"
    assert runbook_for("host_silent", "no_heartbeat") == "SentinelHostSilent.md"
    # a reason or kind nobody wrote a runbook for gets the index, never a dead link
    assert runbook_for("nonsense", "never_heard_of_it") == GENERAL_RUNBOOK


async def test_the_page_gets_the_configured_runbook_base(aiohttp_client: AiohttpClient) -> None:
    assert AggregatorConfig().server.runbook_base_url == DEFAULT_RUNBOOK_BASE
    base = 'https://docs.example/runbooks/"<x>/'
    app = web.Application()
    add_status_page(app, runbook_base=base)
    client = await aiohttp_client(app)
    resp = await client.get("/ui/runbooks.json")
    assert resp.status == 200 and resp.content_type == "application/json"
    table = await resp.json()
    assert table["base"] == base  # JSON-escaped in transit, set as an attribute (never HTML) by the page
    for prefix, name in table["reason_prefixes"]:
        assert runbook_for("degraded", prefix) == name
        assert (RUNBOOKS / name).is_file()
    assert {k: (RUNBOOKS / v).is_file() for k, v in table["kinds"].items()} == dict.fromkeys(
        VERDICT_KINDS, True
    )

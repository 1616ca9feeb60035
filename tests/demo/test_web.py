"""The status page's routes on an aiohttp application."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient

from sentinel.web import ASSETS, add_status_page


async def test_status_page_routes(aiohttp_client: object) -> None:
    app = web.Application()
    add_status_page(app)
    client: TestClient = await aiohttp_client(app)  # type: ignore[operator]
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

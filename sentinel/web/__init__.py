"""The aggregator's status page: static HTML, JavaScript and CSS shipped as package data.

The page polls the aggregator's own JSON API (``/api/v1/...``, contract section 5) from the browser, so the
server side is nothing but three fixed files: :func:`status_page_routes` returns ``GET /`` and
``GET /ui/{name}`` for the aggregator's ``create_app(extra_routes=...)``, and :func:`add_status_page` adds
them to an existing aiohttp application before it starts. The files are read once, at registration,
from the installed package; only the names in :data:`ASSETS` are ever served (no path from the request
reaches the file system).
"""

from __future__ import annotations

import json
from importlib import resources

from aiohttp import web

from sentinel.web.runbooks import runbook_table

#: Served name → content type. Anything else under /ui/ is a 404.
ASSETS: dict[str, str] = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
UI_PREFIX = "/ui/"
#: The runbook links' prefix when the configuration names none (``server.runbook_base_url``).
DEFAULT_RUNBOOK_BASE = "docs/runbooks/"
RUNBOOKS_NAME = "runbooks.json"
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'",
}


def load_assets() -> dict[str, bytes]:
    """The page's files from the installed package (raises FileNotFoundError if the install is broken)."""
    folder = resources.files("sentinel.web") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}


def status_page_routes(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> list[web.RouteDef]:
    """``GET /`` and ``GET /ui/{name}``, for ``create_app(extra_routes=...)`` or ``app.add_routes``.

    ``runbook_base`` (``server.runbook_base_url``) prefixes each verdict's runbook link; the page reads it,
    with the verdict → runbook rules of :mod:`sentinel.web.runbooks`, from ``/ui/runbooks.json``.
    """
    assets = load_assets()
    runbooks = json.dumps(runbook_table(runbook_base)).encode()

    async def index(_: web.Request) -> web.Response:
        return web.Response(
            body=assets["index.html"], content_type=ASSETS["index.html"], charset="utf-8", headers=_HEADERS
        )

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == RUNBOOKS_NAME:
            return web.Response(body=runbooks, content_type="application/json", headers=_HEADERS)
        if name not in ASSETS:
            raise web.HTTPNotFound(text=f"no such file: {UI_PREFIX}{name}\n")
        return web.Response(body=assets[name], content_type=ASSETS[name], charset="utf-8", headers=_HEADERS)

    return [
        web.get("/", index, name="status_page", allow_head=True),
        web.get(UI_PREFIX + "{name}", asset, name="status_page_asset", allow_head=True),
    ]


def add_status_page(app: web.Application, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> None:
    """Serve the status page at ``/`` (and its script and style under ``/ui/``) on ``app``.

    Call before the application starts (aiohttp freezes the router then). The aggregator's API routes are
    untouched; the page only reads them.
    """
    app.add_routes(status_page_routes(runbook_base))

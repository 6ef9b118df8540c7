"""The dashboard: static files at `/` on the node's HTTP port, beside the API.

Theory of operation. The dashboard is a page and its scripts
(`services/api/static`, shipped as package data: no build step at install
or at run time) that call the same `/api/v5` endpoints as any script,
with the API key the user logs in with. So the server side is only this:
the files, read once when the routes are made (about 100 kB), answered
from memory with an ETag (a reload costs a 304) and headers that keep the
page to its own origin (CSP: no inline script, no other host). They need
no key, as EMQX's dashboard files: everything they show comes from the
API, which asks for one.

The chart library is uPlot 1.6.32 (MIT; `npm pack uplot@1.6.32`,
static/vendor/ holds its minified build, its CSS and its licence).

Paths are relative in the page (`dashboard/app.js`, `api/v5/...`), so it
also works behind a proxy that mounts the node under a prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Final

from aiohttp import web

PACKAGE: Final = "services.api"
FOLDER: Final = "static"
INDEX: Final = "index.html"
TYPES: Final = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".txt": "text/plain",
}
HEADERS: Final = {
    # Scripts and styles from this origin only; uPlot sets element styles from
    # script (CSSOM), which style-src does not govern. No framing (clickjacking).
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate (ETag): a new version shows at once
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str

    def response(self, request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers={**HEADERS, "ETag": self.etag})
        return web.Response(body=self.body, headers={**HEADERS, "ETag": self.etag},
                            content_type=self.content_type, charset="utf-8")  # fmt: skip


def _walk(folder: Traversable, prefix: str = "") -> dict[str, Asset]:
    found: dict[str, Asset] = {}
    for entry in folder.iterdir():
        name = prefix + entry.name
        if entry.is_dir():
            found.update(_walk(entry, name + "/"))
            continue
        kind = TYPES.get("." + entry.name.rpartition(".")[2])
        if kind is None:
            continue  # not served: only the kinds the page uses
        body = entry.read_bytes()
        found[name] = Asset(body, kind, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return found


def assets() -> dict[str, Asset]:
    """Every file of the dashboard by its path under static/ ("vendor/uPlot.min.css")."""
    return _walk(files(PACKAGE) / FOLDER)


def routes() -> list[web.RouteDef]:
    """`/` (the page) and `/dashboard/{path}` (its scripts, styles, vendored chart library)."""
    served = assets()
    index = served[INDEX]

    async def page(request: web.Request) -> web.Response:
        return index.response(request)

    async def asset(request: web.Request) -> web.Response:
        found = served.get(request.match_info["path"])
        if found is None:
            raise web.HTTPNotFound(text="no such dashboard file\n")
        return found.response(request)

    return [web.get("/", page), web.get("/dashboard/{path:.+}", asset)]

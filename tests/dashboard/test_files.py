"""The dashboard's files as the node serves them (services/api/dashboard.py),
on an aiohttp server in the test's loop, and as a wheel would ship them."""

from __future__ import annotations

import glob
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.api import dashboard

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "services" / "api"


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    app.add_routes(dashboard.routes())
    async with TestClient(TestServer(app)) as running:
        yield running


async def test_the_page_and_its_files_need_no_key(
    client: TestClient[web.Request, web.Application],
) -> None:
    page = await client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert 'src="dashboard/app.js"' in html and 'href="dashboard/vendor/uPlot.min.css"' in html
    assert "script-src" not in page.headers["Content-Security-Policy"]  # default-src 'self'
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    for path, kind in [("app.js", "text/javascript"), ("vendor/uPlot.iife.min.js",
                       "text/javascript"), ("dashboard.css", "text/css"),
                       ("vendor/uPlot.LICENSE.txt", "text/plain")]:  # fmt: skip
        answer = await client.get(f"/dashboard/{path}")
        assert (answer.status, answer.content_type) == (200, kind), path
    assert "MIT License" in await (await client.get("/dashboard/vendor/uPlot.LICENSE.txt")).text()


async def test_an_unchanged_file_is_a_304(
    client: TestClient[web.Request, web.Application],
) -> None:
    first = await client.get("/dashboard/app.js")
    etag = first.headers["ETag"]
    again = await client.get("/dashboard/app.js", headers={"If-None-Match": etag})
    assert again.status == 304 and await again.read() == b""
    other = await client.get("/dashboard/app.js", headers={"If-None-Match": '"stale"'})
    assert other.status == 200 and await other.read() == await first.read()


async def test_only_the_dashboard_files_are_served(
    client: TestClient[web.Request, web.Application],
) -> None:
    for path in ["/dashboard/nope.js", "/dashboard/../dashboard.py",
                 "/dashboard/%2e%2e/dashboard.py", "/dashboard/vendor"]:  # fmt: skip
        answer = await client.get(path)
        assert answer.status == 404, path


def test_a_wheel_ships_every_dashboard_file() -> None:
    """setuptools takes package data by these globs, relative to the package's
    folder: they must cover every file under static/ (a file they miss would
    be absent from an installed node's dashboard)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["services.api"]
    shipped = {Path(p) for pattern in patterns for p in glob.glob(str(PACKAGE_DIR / pattern))}
    present = {p for p in (PACKAGE_DIR / "static").rglob("*") if p.is_file()}
    assert present and present == shipped
    served = {PACKAGE_DIR / "static" / name for name in dashboard.assets()}
    assert served == present  # and the server serves each of them

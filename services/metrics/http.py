"""The node's HTTP port: an aiohttp server on the node's own event loop.

One port per node (`--http-port`, 18083 on loopback by default; DESIGN 12)
serves `/metrics` in Prometheus's text format and the management API
(`services.api`, its routes given as `routes`), over TLS when given a
context. It runs in the node's loop, so a handler reads the node's figures
directly, with no lock and no thread; a scrape costs one pass over the
figures and a few system calls.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from typing import Final

from aiohttp import web

from services.metrics.collector import Exposition

log = logging.getLogger("weir.http")

HTTP_PORT: Final = 18083  # EMQX's dashboard and API port
SHUTDOWN_GRACE_S: Final = 1.0  # a scrape answers in milliseconds; the node's stop waits no longer


def metrics_routes(exposition: Exposition) -> list[web.RouteDef]:
    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=exposition.render())
        response.headers["Content-Type"] = exposition.content_type
        return response

    return [web.get("/metrics", metrics)]


class HttpServer:
    def __init__(
        self, host: str, port: int, routes: Sequence[web.RouteDef],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        self.host = host
        self.port = port  # 0: a free port, known after start
        self.ssl_context = ssl_context  # None: plain HTTP
        self._app = web.Application()
        self._app.add_routes(routes)
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Listen; returns the port. OSError (a port in use) leaves nothing open."""
        runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site = web.TCPSite(
            runner, self.host, self.port, reuse_address=True, ssl_context=self.ssl_context
        )
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def served(self) -> set[tuple[str, str]]:
        """(method, path) of every route this server answers (HEAD aside)."""
        return {
            (route.method, route.resource.canonical)
            for route in self._app.router.routes()
            if route.resource is not None and route.method != "HEAD"
        }

    def url(self, path: str = "") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}{path}"

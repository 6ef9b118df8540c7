"""The management API of one node: its routes over the node's parts, its key store.

The node builds it once its broker exists (`services.node.node`) and gives
`routes()` to its HTTP port (`services.metrics.http.HttpServer`), so the
API runs on the node's own loop and reads the broker's state directly, with
no lock and no copy. aiohttp, not Starlette: the HTTP port already is an
aiohttp server on that loop (/metrics), and one framework serves both.

`start` stores the `--api-key-file` keys; `close` closes the key store's
Redis connection (the API's own: a slow API call never holds the
session store's pool).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from services.api import apikeys, banned, clients, nodes, pubsub
from services.api.context import Context
from services.api.errors import json_response
from services.api.keys import FileKeyStore, KeyCheck, KeyStore, RedisKeyStore, bootstrap
from services.api.openapi import document
from services.api.peers import Peers
from services.api.routes import Param, Route, aiohttp_routes

if TYPE_CHECKING:
    from services.broker.broker import Broker
    from services.metrics.service import MetricsService

STATUS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "node_name": {"type": "string"},
        "rel_vsn": {"type": "string"},
        "broker_status": {"type": "string"},
        "app_status": {"type": "string"},
    },
}


WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def backends(redis_url: str | None, data_dir: str, node_id: str) -> tuple[KeyStore, Peers | None]:
    """The key store and the peers' addresses: Redis (shared by the cluster)
    when the node has one, else the data dir and no peers."""
    if redis_url is None:
        return FileKeyStore(data_dir), None
    from services.store.redis import connect

    client = connect(redis_url)  # the API's own: a slow call never holds the stores' pool
    return RedisKeyStore(client), Peers(client, node_id)


class Api:
    def __init__(
        self,
        broker: Broker,
        node_id: str,
        version: str,
        store: KeyStore,
        key_pairs: Sequence[tuple[str, str]] = (),
        peers: Peers | None = None,
    ) -> None:
        self.store = store
        self.peers = peers
        self.key_pairs = list(key_pairs)
        forward = peers.forward if peers is not None else None
        self.ctx = Context(broker, node_id, version, time.time(), forward)
        self.check = KeyCheck(store, broker.metrics)
        self.declared: list[Route] = []  # made with the routes (`routes`)

    def _own(self) -> list[Route]:
        ctx = self.ctx

        async def status(request: web.Request) -> Any:
            if request.query.get("format") == "json":
                return {"node_name": ctx.node_id, "rel_vsn": ctx.version,
                        "broker_status": "started", "app_status": "running"}  # fmt: skip
            text = f"Node {ctx.node_id} is started\nweir is running"  # EMQX's two lines
            return web.Response(text=text)

        async def openapi(request: web.Request) -> Any:
            return json_response(document(self.declared, ctx.version))

        return [
            Route("GET", "/status", "Is this node up? (no API key: for load balancers)",
                  status, "status", (Param("format", "json for a JSON answer", enum=("json",)),),
                  STATUS, public=True),
            Route("GET", "/openapi.json", "This document", openapi, "status", (),
                  {"type": "object"}),
        ]  # fmt: skip

    def routes(self, watched: MetricsService) -> list[web.RouteDef]:
        """The API's routes over this node and its metrics service (`watched`:
        figures, alarms), for the HTTP port the metrics service serves."""
        self.declared = [
            *self._own(), *nodes.routes(self.ctx, watched), *clients.routes(self.ctx),
            *pubsub.routes(self.ctx), *banned.routes(self.ctx), *apikeys.routes(self.store),
        ]  # fmt: skip
        return aiohttp_routes(self.declared, self.check)

    async def start(self) -> None:
        """Store the key file's keys (StoreUnavailable if Redis does not answer)."""
        await bootstrap(self.store, self.key_pairs)

    async def announce(self, host: str, port: int, scheme: str = "http") -> None:
        """Tell the peers where this node's API answers (StoreUnavailable if Redis does not)."""
        if self.peers is None:
            return
        if host in WILDCARD_HOSTS:
            host = socket.gethostname()
        host = f"[{host}]" if ":" in host else host
        await self.peers.announce(f"{scheme}://{host}:{port}")

    async def close(self) -> None:
        if self.peers is not None:
            await self.peers.close()
        await self.store.close()

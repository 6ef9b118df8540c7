"""The management API of one node: its routes over the node's parts, its key store.

The node builds it once its broker and listeners exist (`services.node.node`)
and hands `routes` to its metrics service, which calls it once its own parts
(the figures, the alarms) exist and serves the result on the HTTP port
(`services.metrics.http.HttpServer`). So the API runs on the node's own
loop and reads the broker's state directly, with no lock and no copy.
aiohttp, not Starlette: the HTTP port already is an aiohttp server on that
loop (/metrics), and one framework serves both.

One module per resource (clients, nodes and figures, pub/sub state, bans,
users and ACL rules, the node's moving parts, API keys), each declaring its
routes (`services.api.routes`). `start` stores the `--api-key-file` keys,
`announce` tells the peers where this API answers (`services.api.peers`),
`close` closes the API's own Redis connection (a slow API call never holds
the session store's pool).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from services.api import (
    apikeys,
    banned,
    bridges,
    clients,
    dashboard,
    nodes,
    pubsub,
    system,
    trace,
    users,
)
from services.api.context import Context
from services.api.errors import json_response
from services.api.keys import FileKeyStore, KeyCheck, KeyStore, RedisKeyStore, bootstrap
from services.api.openapi import document
from services.api.peers import Peers
from services.api.routes import Param, Route, aiohttp_routes
from services.api.system import System, signal_drain
from services.api.users import Users

if TYPE_CHECKING:
    from services.broker.broker import Broker
    from services.listener.listeners import Listener
    from services.metrics.cluster import ClusterFigures
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


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """What the API needs of the node's settings (the node picks them)."""

    node_id: str
    version: str
    data_dir: str  # the key store on --backend memory
    redis_url: str | None  # None: --backend memory (no peers, no Redis users or rules)
    key_pairs: tuple[tuple[str, str], ...] = ()  # --api-key-file
    password_file: str | None = None  # the users `weir passwd FILE` writes
    plugin_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class Api:
    def __init__(
        self,
        broker: Broker,
        listeners: Sequence[Listener],
        config: ApiConfig,
        drain: Callable[[], None] = signal_drain,
        cluster: Callable[[], ClusterFigures | None] = lambda: None,  # the node's, once built
        bridge_stats: bridges.Bridges = lambda: (),  # the node's data bridges, read per request
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.bridge_stats = bridge_stats
        client = None
        if config.redis_url is None:
            self.store: KeyStore = FileKeyStore(config.data_dir)
            self.peers: Peers | None = None
        else:
            from services.store.redis import connect

            client = connect(config.redis_url)  # the API's own: never holds the stores' pool
            self.store = RedisKeyStore(client)
            self.peers = Peers(client, config.node_id)
        forward = self.peers.forward if self.peers is not None else None
        self.ctx = Context(broker, config.node_id, config.version, time.time(), forward)
        self.check = KeyCheck(self.store, broker.metrics)
        self.users = Users(config.password_file, config.redis_url, client)
        self.system = System(self.ctx, broker.seams.plugins, config.plugin_configs, listeners,
                             drain, config.data_dir)  # fmt: skip
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
        figures, alarms), and the dashboard's files, for the HTTP port the
        metrics service serves."""
        self.declared = [
            *self._own(), *nodes.routes(self.ctx, watched, self.cluster), *clients.routes(self.ctx),
            *pubsub.routes(self.ctx), *banned.routes(self.ctx), *users.routes(self.users),
            *system.routes(self.system), *apikeys.routes(self.store), *trace.routes(self.ctx),
            *bridges.routes(self.ctx, self.bridge_stats),
        ]  # fmt: skip
        return [*aiohttp_routes(self.declared, self.check), *dashboard.routes()]

    async def start(self) -> None:
        """Store the key file's keys (StoreUnavailable if Redis does not answer)."""
        await bootstrap(self.store, list(self.config.key_pairs))

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

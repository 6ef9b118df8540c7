"""/api/v5/plugins, /listeners, /log/level and /nodes/{node}/drain: the
node's moving parts.

- Plugins: those installed (entry points of `weir.plugins`) and those the
  config names, each `running` while its callbacks are on the hook chain
  (`services.hooks.plugins`). Start loads one (with its `[[plugin]]`
  table's config when the config names it), stop unloads it. A change
  lives until the node restarts (the config file decides at start).
- Listeners: each MQTT listener, its address, whether it accepts, its
  connections and limit.
- Log level: as SIGHUP changes it (`services.logs.set_level`), until the
  next SIGHUP or restart.
- Supervisor: under `weir up --nodes N` / `--workers N` each node's data
  dir is `<data-dir>/nodes/<id>` beside the supervisor's pid files
  (`services.machine.pidfiles`): every supervised node, its pid if it runs,
  and its log file, as the supervisor sees them.
- Drain: the SIGUSR1 path itself (the node signals itself): clients are
  told to use another server (0x9C with `--server-reference`) and the node
  stops. The answer (202) goes out before the drain begins. For another
  node, that node is asked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from aiohttp import web

from services import logs
from services.api.context import Context
from services.api.errors import BadRequest, Conflict, NotFound
from services.api.routes import Param, Route, body_of
from services.hooks.plugins import ENTRY_POINT_GROUP, Plugins, resolve
from services.listener.listeners import Listener
from services.machine.pidfiles import NODES_DIR, NodeFiles, StalePidFile, live_pid, node_ids

LEVELS = ("debug", "info", "warning", "error")
PLUGIN: dict[str, Any] = {"type": "object", "properties": {
    "name": {"type": "string"}, "running": {"type": "boolean"},
    "configured": {"type": "boolean"}}}  # fmt: skip
LISTENER: dict[str, Any] = {"type": "object", "properties": {
    "id": {"type": "string"}, "name": {"type": "string"}, "type": {"type": "string"},
    "bind": {"type": "string"}, "running": {"type": "boolean"},
    "current_connections": {"type": "integer"},
    "max_connections": {"type": "integer", "nullable": True}}}  # fmt: skip
SUPERVISED: dict[str, Any] = {"type": "object", "properties": {
    "node": {"type": "string"}, "pid": {"type": "integer", "nullable": True},
    "running": {"type": "boolean"}, "log": {"type": "string"}}}  # fmt: skip
LEVEL: dict[str, Any] = {"type": "object", "properties": {
    "level": {"type": "string", "enum": list(LEVELS)}}}  # fmt: skip


def _installed() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


class System:
    def __init__(
        self,
        ctx: Context,
        plugins: Plugins | None,
        configured: Mapping[str, Mapping[str, Any]],  # [[plugin]] name -> its config
        listeners: Sequence[Listener],
        drain: Callable[[], None],
        data_dir: str = "",
    ) -> None:
        self.ctx = ctx
        self.plugins = plugins
        self.configured = configured
        self.listeners = listeners
        self.drain_now = drain
        self.data_dir = Path(data_dir).resolve()

    def _registry(self) -> Plugins:
        if self.plugins is None:
            raise NotFound("this node has no plugin registry")
        return self.plugins

    async def plugin_list(self, request: web.Request) -> Any:
        running = set(self.plugins.names()) if self.plugins is not None else set()
        names = sorted(set(_installed()) | set(self.configured) | running)
        return [{"name": n, "running": n in running, "configured": n in self.configured}
                for n in names]  # fmt: skip

    async def plugin_start(self, request: web.Request) -> Any:
        registry, name = self._registry(), request.match_info["name"]
        if name in registry.names():
            raise Conflict(f"plugin {name} is running")
        if name not in self.configured and name not in _installed():
            raise NotFound(f"no such plugin: {name} (installed: {', '.join(_installed())})")
        try:
            target = resolve(name)
            plugin = target if hasattr(target, "register") and not isinstance(target, type) \
                else target(dict(self.configured.get(name, {})))  # fmt: skip
            registry.load(name, plugin)
        except Exception as exc:  # a plugin's own failure: one line, the node goes on
            raise BadRequest(f"plugin {name}: {type(exc).__name__}: {exc}") from None
        return {"name": name, "running": True, "configured": name in self.configured}

    async def plugin_stop(self, request: web.Request) -> Any:
        registry, name = self._registry(), request.match_info["name"]
        if name not in registry.names():
            raise NotFound(f"plugin {name} is not running")
        registry.unload(name)
        return {"name": name, "running": False, "configured": name in self.configured}

    async def listener_list(self, request: web.Request) -> Any:
        rows = []
        for listener in self.listeners:
            config = listener.config
            host = config.host or "?"
            rows.append({
                "id": f"{config.type}:{listener.name}", "name": listener.name,
                "type": str(config.type), "bind": f"{host}:{listener.port}",
                "running": listener.server is not None and listener.server.is_serving(),
                "current_connections": listener.connections,
                "max_connections": listener.limit,
            })  # fmt: skip
        return rows

    async def level(self, request: web.Request) -> Any:
        return {"level": logging.getLevelName(logging.getLogger().level).lower()}

    async def set_level(self, request: web.Request) -> Any:
        level = (await body_of(request)).get("level")
        if level not in LEVELS:
            raise BadRequest(f"level must be one of {', '.join(LEVELS)}")
        logs.set_level(str(level))
        return {"level": level}

    async def supervised(self, request: web.Request) -> Any:
        root = self.data_dir.parent
        if root.name != NODES_DIR or not NodeFiles(self.ctx.node_id, root).pid.exists():
            raise NotFound("this node does not run under weir up --nodes or --workers")
        rows = []
        for node_id in node_ids(root.parent):
            files = NodeFiles(node_id, root)
            try:
                pid: int | None = live_pid(files)
            except StalePidFile:
                pid = None
            rows.append({"node": node_id, "pid": pid, "running": pid is not None,
                         "log": str(files.log)})  # fmt: skip
        return rows

    async def drain(self, request: web.Request) -> Any:
        node = request.match_info["node"]
        if node != self.ctx.node_id:
            cluster = self.ctx.broker.cluster
            if self.ctx.forward is None or cluster is None or node not in cluster.peers():
                raise NotFound(f"no such live node: {node}")
            status, body = await self.ctx.forward(node, request)
            if status >= 400:
                raise NotFound(body.get("message", f"node {node} answered {status}"))
            return body
        asyncio.get_running_loop().call_soon(self.drain_now)  # after this answer is written
        return {"node": node, "draining": True}


def signal_drain() -> None:
    """The node's own SIGUSR1: `weir up`'s drain path (services.node.app)."""
    os.kill(os.getpid(), signal.SIGUSR1)


def routes(system: System) -> Iterable[Route]:
    name = Param("name", "the plugin's name", where="path", required=True)
    node = Param("node", "a node id", where="path", required=True)
    return (
        Route("GET", "/plugins", "Plugins installed or configured, and which run",
              system.plugin_list, "plugins", (), {"type": "array", "items": PLUGIN}),
        Route("PUT", "/plugins/{name}/start", "Load a plugin (until the node restarts)",
              system.plugin_start, "plugins", (name,), PLUGIN),
        Route("PUT", "/plugins/{name}/stop", "Unload a plugin (until the node restarts)",
              system.plugin_stop, "plugins", (name,), PLUGIN),
        Route("GET", "/listeners", "The MQTT listeners", system.listener_list, "listeners",
              (), {"type": "array", "items": LISTENER}),
        Route("GET", "/log/level", "The log level", system.level, "log", (), LEVEL),
        Route("PUT", "/log/level", "Change the log level (until SIGHUP or a restart)",
              system.set_level, "log", (), LEVEL, body=LEVEL),
        Route("GET", "/supervisor/nodes", "Under weir up --nodes/--workers: the supervisor's "
              "nodes, their pids and logs", system.supervised, "nodes", (),
              {"type": "array", "items": SUPERVISED}),
        Route("POST", "/nodes/{node}/drain", "Drain a node (SIGUSR1): clients told to go "
              "elsewhere, then it stops", system.drain, "nodes", (node,),
              {"type": "object"}, status=202),
    )  # fmt: skip

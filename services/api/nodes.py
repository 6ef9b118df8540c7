"""/api/v5/nodes, /stats, /metrics and /alarms: what a node says about itself.

Figures are read from memory (`services.metrics.registry`: the same
objects /metrics renders, refreshed first), never a re-parse of the
Prometheus text; other nodes' as they last wrote them for the cluster's
sum (`services.metrics.cluster`). The node list is this node in full and each live peer
the membership knows, with the count of clients the event log puts on it;
`GET /nodes/{node}` for a peer asks that peer (`Context.forward`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from services.api.context import Context
from services.api.errors import NotFound, Unavailable
from services.api.paging import Page
from services.api.routes import Param, Route, page_params, paged
from services.metrics.cluster import ClusterFigures, Figures, figures_of
from services.metrics.process import read_process
from services.metrics.service import MetricsService
from services.store.errors import StoreUnavailable

NODE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "node": {"type": "string"},
        "node_status": {"type": "string"},
        "version": {"type": "string"},
        "uptime": {"type": "integer", "description": "milliseconds", "nullable": True},
        "connections": {"type": "integer"},
        "live_connections": {"type": "integer"},
        "memory_used": {"type": "integer", "nullable": True},
        "memory_total": {"type": "integer", "nullable": True},
        "max_fds": {"type": "integer", "nullable": True},
        "peers": {"type": "array", "items": {"type": "string"}},
    },
}
FIGURES: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "number"}}
ALARM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "node": {"type": "string"},
        "name": {"type": "string"},
        "message": {"type": "string"},
        "details": {"type": "object"},
        "activated": {"type": "boolean"},
        "activate_at": {"type": "string"},
        "deactivate_at": {"type": "string", "nullable": True},
        "duration": {"type": "integer", "description": "milliseconds"},
    },
}


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def dotted(name: str) -> str:
    """EMQX's metric names: messages_received -> messages.received."""
    return name.replace("_", ".")


def flat(figures: Figures) -> dict[str, Any]:
    """Every family under its dotted name: a total, and one per label value."""
    out: dict[str, Any] = {}
    for name, value in figures.items():
        key = dotted(name)
        if isinstance(value, dict):
            out[key] = sum(value.values())
            for label, figure in value.items():
                out[f"{key}.{label}"] = figure
        else:
            out[key] = value
    return out


class Nodes:
    def __init__(
        self, ctx: Context, watched: MetricsService,
        cluster: Callable[[], ClusterFigures | None],
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.watched = watched
        self.cluster = cluster  # the node's cluster figures, once it runs them

    def _peers(self) -> list[str]:
        cluster = self.ctx.broker.cluster
        return sorted(cluster.peers()) if cluster is not None else []

    def own(self) -> dict[str, Any]:
        broker = self.ctx.broker
        process = read_process()
        return {
            "node": self.ctx.node_id,
            "node_status": "running",
            "version": self.ctx.version,
            "uptime": int((time.time() - self.ctx.started_at) * 1000),
            "connections": len(broker.sessions),
            "live_connections": len(broker.connections),
            "memory_used": process.rss_bytes,
            "memory_total": process.memory_total_bytes,
            "max_fds": process.max_fds,
            "peers": self._peers(),
        }

    def peer(self, node: str) -> dict[str, Any]:
        """A live peer as this node knows it: its clients from the event log."""
        sessions = self.ctx.broker.logstate.view.sessions().values()
        online = sum(1 for e in sessions if e.node == node and e.online)
        return {"node": node, "node_status": "running", "version": None, "uptime": None,
                "connections": sum(1 for e in sessions if e.node == node),
                "live_connections": online, "memory_used": None, "memory_total": None,
                "max_fds": None, "peers": None}  # fmt: skip

    async def list(self, request: web.Request) -> Any:
        return [self.own(), *(self.peer(n) for n in self._peers())]

    async def one(self, request: web.Request) -> Any:
        node = request.match_info["node"]
        if node == self.ctx.node_id:
            return self.own()
        if node not in self._peers():
            raise NotFound(f"no such live node: {node}")
        if self.ctx.forward is not None:
            status, body = await self.ctx.forward(node, request)
            if status == 200:
                return body
        return self.peer(node)

    def figures(self) -> dict[str, Any]:
        """This node's metrics, fresh from memory."""
        metrics = self.watched.metrics
        self.watched.figures(metrics)
        return {"node": self.ctx.node_id, **flat(figures_of(metrics))}

    async def metrics(self, request: web.Request) -> Any:
        """Every live node's figures (this one's fresh, the others' as they last
        wrote them: `services.metrics.cluster`), or their sum (`aggregate`)."""
        cluster = self.cluster()
        if cluster is None:  # no cluster figures (yet): this node's
            mine = self.figures()
            return {k: v for k, v in mine.items() if k != "node"} \
                if request.query.get("aggregate") == "true" else [mine]  # fmt: skip
        try:
            folded = await cluster.collect()
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot read the cluster's figures: {exc}") from None
        if request.query.get("aggregate") == "true":
            return {"nodes": list(folded.nodes), **flat(folded.figures)}
        per_node = sorted(folded.per_node.items())
        return [{"node": node, **flat(figures)} for node, figures in per_node]

    async def stats(self, request: web.Request) -> Any:
        metrics = self.watched.metrics
        self.watched.figures(metrics)
        view = self.ctx.broker.logstate.view
        return [{
            "node": self.ctx.node_id,
            "connections.count": len(self.ctx.broker.sessions),
            "live_connections.count": metrics.connections,
            "connections.max": metrics.connections_max,
            "sessions.count": metrics.sessions,
            "subscriptions.count": metrics.subscriptions,
            "retained.count": metrics.retained,
            "topics.count": len({f for subs in view.all_subscriptions().values() for f in subs}),
            "cluster.sessions.count": len(view.sessions()),
        }]  # fmt: skip

    def _alarm(self, alarm: Any, activated: bool) -> dict[str, Any]:
        ends = alarm.deactivated_at
        return {
            "node": self.ctx.node_id, "name": alarm.name, "message": alarm.message,
            "details": dict(alarm.details), "activated": activated,
            "activate_at": iso(alarm.activated_at), "deactivate_at": iso(ends),
            "duration": int(((ends or time.time()) - alarm.activated_at) * 1000),
        }  # fmt: skip

    async def alarms(self, request: web.Request) -> Any:
        alarms = self.watched.alarms
        rows = []
        wanted = request.query.get("activated")
        if wanted in (None, "true"):
            rows += [self._alarm(a, True) for a in alarms.active.values()]
        if wanted in (None, "false"):
            rows += [self._alarm(a, False) for a in reversed(alarms.history)]
        return Page.of(request.query).answer(rows)

    async def clear_history(self, request: web.Request) -> Any:
        self.watched.alarms.history.clear()
        return None


def routes(
    ctx: Context, watched: MetricsService, cluster: Callable[[], ClusterFigures | None]
) -> Iterable[Route]:
    nodes = Nodes(ctx, watched, cluster)
    node = Param("node", "a node id", where="path", required=True)
    activated = Param("activated", "true: active ones; false: the past ones", "boolean")
    return (
        Route("GET", "/nodes", "This node and its live peers", nodes.list, "nodes", (),
              {"type": "array", "items": NODE}),
        Route("GET", "/nodes/{node}", "One node", nodes.one, "nodes", (node,), NODE),
        Route("GET", "/stats", "This node's counts (connections, sessions, topics...)",
              nodes.stats, "metrics", (), {"type": "array", "items": FIGURES}),
        Route("GET", "/metrics", "Every live node's metrics (EMQX's dotted names), or their "
              "sum", nodes.metrics, "metrics",
              (Param("aggregate", "true: one sum over the live nodes", "boolean"),),
              {"oneOf": [{"type": "array", "items": FIGURES}, FIGURES]}),
        Route("GET", "/alarms", "Active alarms, then past ones (newest first)", nodes.alarms,
              "alarms", page_params(activated), paged(ALARM)),
        Route("DELETE", "/alarms", "Forget the past alarms", nodes.clear_history, "alarms", (),
              None, status=204),
    )  # fmt: skip

"""/api/v5/bridges: this node's data bridges, their state and figures.

Each node runs every bridge of its config file (`services.bridge`): an out
bridge takes the messages its own clients publish, an in bridge the Kafka
partitions the consumer group gave it; so the figures are the node's, and a
cluster's are the sum over its nodes (ask each, e.g. `weir ctl --url`).
The state is `running`, `kafka_down` (the bridge's Kafka cannot be reached
now, `services.bridge.health`) or `stopped`. EMQX calls the two kinds
`kafka_producer` and `kafka_consumer`; `type` says that, `direction` says
out or in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from aiohttp import web

from services.api.context import Context
from services.api.errors import NotFound
from services.api.routes import Param, Route
from services.bridge.api import OUT, BridgeStats

Bridges = Callable[[], Sequence[BridgeStats]]  # the node's, read per request

BRIDGE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "type": {"type": "string", "enum": ["kafka_producer", "kafka_consumer"]},
        "direction": {"type": "string", "enum": ["out", "in"]},
        "status": {"type": "string", "enum": ["running", "kafka_down", "stopped"]},
        "node": {"type": "string"},
        "metrics": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}


def bridge_json(stats: BridgeStats, node: str) -> dict[str, Any]:
    return {
        "name": stats.name,
        "type": "kafka_producer" if stats.direction == OUT else "kafka_consumer",
        "direction": stats.direction,
        "status": stats.state,
        "node": node,
        "metrics": stats.figures(),
    }


def routes(ctx: Context, bridges: Bridges) -> Iterable[Route]:
    async def listed(request: web.Request) -> Any:
        return [bridge_json(s, ctx.node_id) for s in bridges()]

    async def one(request: web.Request) -> Any:
        name = request.match_info["name"]
        for stats in bridges():
            if stats.name == name:
                return bridge_json(stats, ctx.node_id)
        raise NotFound(f"no bridge named {name!r} on this node")

    name = Param("name", "the bridge's name (its table's `name`)", where="path", required=True)
    return (
        Route("GET", "/bridges", "This node's data bridges: state and figures", listed,
              "bridges", (), {"type": "array", "items": BRIDGE}),
        Route("GET", "/bridges/{name}", "One data bridge of this node", one, "bridges",
              (name,), BRIDGE),
    )  # fmt: skip

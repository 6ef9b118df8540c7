"""What the API's handlers read: the node's parts, passed in when the API is built."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from services.broker.broker import Broker

# Ask the node that holds a client (`node`) to answer this request itself
# (services.api.peers): the answer's (status, JSON body).
Forward = Callable[[str, web.Request], Awaitable[tuple[int, Any]]]


@dataclass(frozen=True, slots=True)
class Context:
    broker: Broker
    node_id: str
    version: str
    started_at: float  # unix seconds the node started
    forward: Forward | None = None  # None: a node alone (no peers to ask)

"""Asking the node that holds a client: its API, reached at the address it announces.

Why the peer's API and not a message on the node link: the answer a peer
gives (a client's detail, the outcome of a kick) is the same JSON its own
API gives, with its own checks and errors, and nothing new crosses the
link's framing (services.cluster.frames), which carries the hot path's
forwarded messages and must stay small. An admin request is rare; one
HTTP round trip on loopback or a LAN costs milliseconds.

Each node announces its API's base URL at start in the Redis hash
`weir:api:nodes` (field: node id), beside its cluster membership record;
a request for a client on node B is re-sent there with the caller's own
`Authorization` header (keys are the cluster's, in the same Redis), the
same method, path, query and body, and marked `X-Weir-Forwarded` so a
node that does not hold the client either answers 404 instead of passing
it on again (the log's view and a peer may disagree for a moment).
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from services.api.errors import NotFound, Unavailable
from services.store.errors import StoreUnavailable
from services.store.redis import DEFAULT_TIMEOUT_S, bounded

NODES_KEY: Final = "weir:api:nodes"  # hash: node id -> the node's API base URL
FORWARDED: Final = "X-Weir-Forwarded"  # header: the request comes from a peer (once only)
FORWARD_TIMEOUT_S: Final = 5.0  # a peer answers an API call in milliseconds; a dead one, never


class Peers:
    def __init__(self, client: aioredis.Redis, node_id: str) -> None:
        self._client = client
        self.node_id = node_id
        self._session: aiohttp.ClientSession | None = None

    async def announce(self, base_url: str) -> None:
        await bounded(self._client.hset(NODES_KEY, self.node_id, base_url), DEFAULT_TIMEOUT_S)

    async def address(self, node: str) -> str | None:
        raw = await bounded(self._client.hget(NODES_KEY, node), DEFAULT_TIMEOUT_S)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def forward(self, node: str, request: web.Request) -> tuple[int, Any]:
        """(status, JSON body) of `request` as `node` answers it."""
        if request.headers.get(FORWARDED):
            raise NotFound(f"{request.path}: not on {self.node_id} either (asked by a peer)",
                           code="CLIENTID_NOT_FOUND")  # fmt: skip
        try:
            base = await self.address(node)
        except StoreUnavailable as exc:
            raise Unavailable(f"cannot find node {node}'s API: {exc}") from None
        if base is None:
            raise Unavailable(f"node {node} announced no API address")
        headers = {FORWARDED: self.node_id}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        if request.content_type == "application/json":
            headers["Content-Type"] = "application/json"
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S))
        try:
            async with self._session.request(
                request.method, base + request.raw_path, headers=headers, data=await request.read(),
            ) as answer:  # fmt: skip
                if answer.content_type == "application/json":
                    return answer.status, await answer.json()
                return answer.status, {}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"node {node} did not answer: {exc!r}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

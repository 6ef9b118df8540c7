"""Banned clients: by client id, user name or address (CIDR), each until a time.

Theory of operation. A `Ban` names one kind of who (`clientid`, `username`,
`peerhost`: an address or a CIDR network) and when it ends (`until`, Unix
seconds; None: never). Every node keeps the table in memory (`BanTable`), so
a CONNECT is checked without a round trip (`match`). Two stores fill it:

- `MemoryBans` (`--backend memory`): the table is the store; bans come from
  flapping detection or from code.
- `RedisBans`: the store is the hash `weir:banned` (field `<kind>:<who>`,
  value the ban's JSON), shared by every node and by `weir ban`. Whoever
  adds or deletes a ban publishes it on the channel `weir:banned`; every node
  subscribes and applies it at once (milliseconds). Pub/sub drops what is
  sent while a subscriber reconnects, so every node also reads the whole
  hash every `POLL_S` seconds: a missed ban is applied within that bound.

A ban that is new to a node's table (by message or by poll) is handed to
`on_added` (given when the table is built), which the node uses to
disconnect matching connected clients (`services.broker.seams.Kicks`).
An expired ban is ignored by `match` and deleted from Redis by the next
poll or listing that sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("weir.banned")

KINDS = ("clientid", "username", "peerhost")
KEY = "weir:banned"  # hash: "<kind>:<who>" -> ban JSON
CHANNEL = "weir:banned"  # pub/sub: {"op": "add" | "del", "ban": {...}}
POLL_S = 5.0  # seconds: a ban whose message a node missed reaches it within this
RESUBSCRIBE_S = 1.0  # seconds between attempts to subscribe again after Redis went away
CALL_S = 2.0  # seconds one Redis call may take (a dead Redis must not hold a CONNECT)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class BanError(ValueError):
    """A ban that cannot be: an unknown kind, an empty name, a bad address."""


@dataclass(frozen=True, slots=True)
class Ban:
    kind: str  # one of KINDS
    who: str  # the client id, user name, or address / CIDR network
    until: float | None = None  # Unix seconds; None: never ends
    reason: str = ""
    by: str = "admin"  # "admin" (weir ban), "flapping"

    @property
    def field(self) -> str:
        return f"{self.kind}:{self.who}"

    def active(self, now: float) -> bool:
        return self.until is None or self.until > now

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Ban:
        return checked(cls(**json.loads(text)))

    def describe(self) -> str:
        ends = (
            "never"
            if self.until is None
            else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.until))
        )
        return f"{self.kind} {self.who} until {ends} by {self.by}" + (
            f" ({self.reason})" if self.reason else ""
        )


def checked(ban: Ban) -> Ban:
    """`ban` if it can be applied (a peerhost ban is normalised to its network)."""
    if ban.kind not in KINDS:
        raise BanError(f"unknown kind {ban.kind!r}: expected one of {', '.join(KINDS)}")
    if not ban.who:
        raise BanError(f"an empty {ban.kind}")
    if ban.kind == "peerhost":
        try:
            network = ipaddress.ip_network(ban.who, strict=False)
        except ValueError:
            raise BanError(f"not an address or CIDR network: {ban.who!r}") from None
        if str(network) != ban.who:
            ban = Ban(ban.kind, str(network), ban.until, ban.reason, ban.by)
    return ban


def peer_host(peer: str) -> str:
    """The address of "host:port" ("[::1]:5" and "::1:5" alike; "?" stays "?")."""
    host = peer.rpartition(":")[0] if ":" in peer else peer
    return host.strip("[]")


def covers(ban: Ban, client_id: str | None, username: str | None, peer: str) -> bool:
    """Whether `ban` applies to this client (for disconnecting the connected)."""
    if ban.kind == "clientid":
        return client_id == ban.who
    if ban.kind == "username":
        return username == ban.who
    try:
        address = ipaddress.ip_address(peer_host(peer))
    except ValueError:
        return False
    return address in ipaddress.ip_network(ban.who, strict=False)


class BanTable:
    """The bans a node checks CONNECTs against, in memory."""

    def __init__(self, on_added: Callable[[Ban], None] | None = None) -> None:
        self._bans: dict[str, Ban] = {}
        self._networks: dict[str, Network] = {}  # peerhost field -> network
        self.on_added: Callable[[Ban], None] = on_added or (lambda ban: None)

    def match(self, client_id: str, username: str | None, peer: str) -> Ban | None:
        """The active ban this client falls under, or None."""
        if not self._bans:
            return None
        now = time.time()
        for field in (f"clientid:{client_id}", f"username:{username}" if username else ""):
            ban = self._bans.get(field)
            if ban is not None and ban.active(now):
                return ban
        if self._networks:
            try:
                address = ipaddress.ip_address(peer_host(peer))
            except ValueError:
                return None
            for field, network in self._networks.items():
                ban = self._bans[field]
                if address in network and ban.active(now):
                    return ban
        return None

    def bans(self) -> list[Ban]:
        now = time.time()
        return sorted((b for b in self._bans.values() if b.active(now)), key=lambda b: b.field)

    def _put(self, ban: Ban) -> None:
        """Apply an added ban; a new one (or a longer one) goes to `on_added`."""
        old = self._bans.get(ban.field)
        self._bans[ban.field] = ban
        if ban.kind == "peerhost":
            self._networks[ban.field] = ipaddress.ip_network(ban.who, strict=False)
        if old != ban and ban.active(time.time()):
            self.on_added(ban)

    def _drop(self, field: str) -> bool:
        self._networks.pop(field, None)
        return self._bans.pop(field, None) is not None

    def _replace(self, bans: list[Ban]) -> None:
        fields = {ban.field for ban in bans}
        for field in [f for f in self._bans if f not in fields]:
            self._drop(field)
        for ban in bans:
            self._put(ban)


class MemoryBans(BanTable):
    """The bans of one process (`--backend memory`)."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def add(self, ban: Ban) -> None:
        self._put(checked(ban))

    async def delete(self, kind: str, who: str) -> bool:
        return self._drop(checked(Ban(kind, who)).field)

    async def list(self) -> list[Ban]:
        return self.bans()


class RedisBans(BanTable):
    """The cluster's bans in Redis, mirrored here (module docstring)."""

    def __init__(
        self, client: Any, poll_s: float = POLL_S, on_added: Callable[[Ban], None] | None = None
    ) -> None:
        super().__init__(on_added)
        self.client = client
        self.poll_s = poll_s
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Read the table (an unreachable Redis: start empty, the poll fills it),
        then follow the channel and poll."""
        with contextlib.suppress(Exception):
            await self._load()
        self._tasks = [
            asyncio.create_task(self._follow(), name="bans-follow"),
            asyncio.create_task(self._poll(), name="bans-poll"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def add(self, ban: Ban) -> None:
        ban = checked(ban)
        async with asyncio.timeout(CALL_S):
            await self.client.hset(KEY, ban.field, ban.to_json())
            await self.client.publish(CHANNEL, json.dumps({"op": "add", "ban": asdict(ban)}))
        self._put(ban)

    async def delete(self, kind: str, who: str) -> bool:
        field = checked(Ban(kind, who)).field
        async with asyncio.timeout(CALL_S):
            removed = bool(await self.client.hdel(KEY, field))
            await self.client.publish(CHANNEL, json.dumps({"op": "del", "field": field}))
        self._drop(field)
        return removed

    async def list(self) -> list[Ban]:
        await self._load()
        return self.bans()

    async def _load(self) -> None:
        async with asyncio.timeout(CALL_S):
            raw = await self.client.hgetall(KEY)
        bans: list[Ban] = []
        expired: list[Ban] = []
        now = time.time()
        for field, text in raw.items():
            try:
                ban = Ban.from_json(text)
            except (ValueError, TypeError) as exc:
                log.warning("ban %r in Redis ignored: %s", field, exc)
                continue
            (bans if ban.active(now) else expired).append(ban)
        if expired:
            async with asyncio.timeout(CALL_S):
                await self.client.hdel(KEY, *[ban.field for ban in expired])
        self._replace(bans)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self._load()
            except Exception as exc:
                log.warning("bans not read from Redis: %r", exc)  # TimeoutError's text is empty

    async def _follow(self) -> None:
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                await self._load()  # what was sent before the subscription
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._apply(message["data"])
            except Exception as exc:
                log.warning("ban channel lost (%r); polling every %.0f s", exc, self.poll_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(RESUBSCRIBE_S)

    def _apply(self, data: str | bytes) -> None:
        try:
            change = json.loads(data)
            if change["op"] == "add":
                self._put(checked(Ban(**change["ban"])))
            elif change["op"] == "del":
                self._drop(str(change["field"]))
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("ban message ignored: %s", exc)


BanStore = MemoryBans | RedisBans

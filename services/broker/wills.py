"""Wills: stored with the session, published once cluster-wide, delay included.

Theory of operation. A connection whose CONNECT carries a will gets a token,
and the will is stored under it (`WillStore.put`, before CONNACK), with the
connection's user name and address; a new connection of the same client
replaces it and gets the replaced will back, which it publishes at once if
the old session ended (clean start), the old will had no delay, or its delay
has passed; otherwise the session resumed in time and the will is never sent
[MQTT-3.1.3-9]. When a connection ends with its will due (`ended`), the will
goes out after min(will delay, session expiry): at once, or on a timer here
after `arm` recorded when it is due, so that a survivor can still send it if
this node dies meanwhile. A normal DISCONNECT discards the will (`discard`),
and the connection manager awaits that before it ends the session: until
the will is gone from the store the session stays online on this node, so a
node that dies in between looks to a survivor like one that died before the
DISCONNECT arrived. Every publish first removes the will under its token
(`take`): only one of the owner, a new connection and a survivor can get
it, so it goes out exactly once; a node that dies between taking and
publishing loses it (at most once).

A node that finds another node dead (`adopt_from`), or itself restarted,
adopts the wills that node was to publish: due ones go out at once, the
others on a timer here. Whoever publishes a will asks the ACL as the client
that set it (its stored user name and address), not as an anonymous one.
A will that cannot be stored is never acknowledged: the CONNECT is refused
(`opened` raises, the connection manager answers 0x88 server unavailable),
since a will kept in one node's memory would be lost with that node while
its client believed it safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from services.broker.ports import ConnectionPort, now_ms
from services.mqtt.actions import OpenSession
from services.mqtt.packets import NO_PROPERTIES, Message, Will
from services.session.api import SessionError, StoredWill, WillStore
from services.store import serial
from services.tasks import each

log = logging.getLogger("weir.wills")
TAKEOVER_WIDTH = 32  # a dead node's wills (and, in orphans, sessions) taken over at once
RETRY_S = 2.0  # a will the store did not hand over is asked for again after this


def will_message(client_id: str, will: Will) -> Message:
    """The message a will publishes (its expiry counts from when it goes out)."""
    props = will.properties
    if props is not NO_PROPERTIES:
        props = dataclasses.replace(props, will_delay_interval=None)
    return Message(will.topic, will.payload, will.qos, will.retain, props, sender=client_id)


def due_now(old: StoredWill, fresh: bool, now: int) -> bool:
    """Whether a will replaced by a new connection goes out: the old session
    ended, the will had no delay, or its delay has passed."""
    return fresh or old.delay_s <= 0 or 0 < old.due_ms <= now


class Wills:
    def __init__(
        self,
        *,
        node_id: str,
        store: WillStore,
        publish: Callable[[Message, str | None, str], object],
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ) -> None:
        self.node_id = node_id
        self.store = store
        self._publish = publish
        self.loop = loop
        self.spawn = spawn
        self._timers: dict[str, asyncio.TimerHandle] = {}  # client -> its will's timer here
        # token -> who set its will (user name, peer), for the ACL when it goes out
        self._who: dict[str, tuple[str | None, str]] = {}

    @staticmethod
    def token() -> str:
        return secrets.token_hex(8)

    async def connection_opened(
        self, conn: ConnectionPort, action: OpenSession, fresh: bool, known: bool
    ) -> str | None:
        """`opened` for the CONNECT `action` of `conn` (its user name and address
        kept with the will); the token its will is stored under, None without
        one. Raises SessionError if the will cannot be stored."""
        will = action.connect.will
        delay_s = 0 if will is None else will.properties.will_delay_interval or 0
        client = conn.client
        username = client.username if client is not None else action.connect.username
        peer = client.peer if client is not None else conn.peer
        token = self.token()
        await self.opened(
            action.client_id, token, will, min(delay_s, action.session_expiry_s), fresh, known,
            username, peer,
        )  # fmt: skip
        return token if will is not None else None

    async def opened(
        self, client_id: str, token: str, will: Will | None, delay_s: int, fresh: bool,
        known: bool, username: str | None = None, peer: str = "",
    ) -> None:  # fmt: skip
        """A connection of the client opens its session: store its will and
        publish the one it replaces if that is due. `known`: the client may
        have a stored will (a session of it exists); without a will of its own
        and none known, nothing is asked. Raises SessionError if the
        connection's will cannot be stored (its CONNECT is then refused)."""
        if will is None and not known:
            return
        message = None if will is None else will_message(client_id, will)
        blob = None if message is None else serial.dumps(message)
        try:
            old = await self.store.put(
                client_id, self.node_id, token, blob, delay_s, username, peer
            )
        except SessionError as exc:
            if message is not None:
                raise
            log.warning("stored will of %s not looked at: %s", client_id, exc)
            return
        if message is not None:
            self._who[token] = (username, peer)
        self._cancel(client_id)
        if old is not None and due_now(old, fresh, now_ms()):
            self._send(old.message, old.username, old.peer)

    def ended(self, client_id: str, token: str, delay_s: int) -> None:
        """Connection `token` ended without a normal DISCONNECT: its will goes
        out after delay_s."""
        if delay_s > 0:
            self.spawn(self._arm(client_id, token, now_ms() + delay_s * 1000))
        self._due_at(client_id, token, delay_s)

    async def discard(self, client_id: str, token: str) -> None:
        """Connection `token` ended with a normal DISCONNECT: its will is
        removed from the store when this returns (or the store failed: logged)."""
        await self._take(client_id, token, publish=False)

    async def discard_before(
        self, client_id: str, token: str, end: Coroutine[Any, Any, None]
    ) -> None:
        """A normal DISCONNECT's session end (`end`): its will leaves the store
        first. Until then the session is online here, so if this node dies
        before, a survivor adopts both, as if the DISCONNECT never arrived."""
        try:
            await self.discard(client_id, token)
        finally:
            await end

    async def adopt_from(self, dead: str) -> int:
        """Take over the wills the dead node `dead` was to publish; how many.
        Raises SessionError if the store cannot be read (the caller retries)."""

        async def adopt(client_id: str) -> bool:
            token = self.token()
            will = await self.store.adopt(client_id, dead, self.node_id, token, now_ms())
            if will is None:
                return False
            self._who[token] = (will.username, will.peer)
            delay_s = (will.due_ms - now_ms()) / 1000
            if delay_s > 0:
                self._due_at(client_id, token, delay_s)
            else:  # here, not spawned: 18,000 takes at once outwaited the store's timeout
                await self._take(client_id, token, True)
            return True

        return await each(await self.store.orphans(dead), adopt, TAKEOVER_WIDTH)

    def _due_at(self, client_id: str, token: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.spawn(self._take(client_id, token, True))
        else:
            self._later(client_id, delay_s, lambda: self.spawn(self._take(client_id, token, True)))

    async def _arm(self, client_id: str, token: str, due_ms: int) -> None:
        try:
            await self.store.arm(client_id, token, due_ms)
        except SessionError as exc:  # the timer here still sends it
            log.warning("due time of %s's will not stored: %s", client_id, exc)

    async def _take(self, client_id: str, token: str, publish: bool) -> None:
        who = self._who.pop(token, (None, ""))
        try:
            blob = await self.store.take(client_id, token)
        except SessionError as exc:
            if not publish:
                log.warning("will of %s not dropped: %s", client_id, exc)
                return
            log.warning("will of %s not sent yet: %s; retrying in %.0f s", client_id, exc, RETRY_S)
            self._who[token] = who  # still ours in the store: sent on a later try
            self._later(client_id, RETRY_S, lambda: self.spawn(self._take(client_id, token, True)))
            return
        if blob is not None and publish:
            self._send(blob, *who)

    def _send(self, blob: bytes, username: str | None, peer: str) -> None:
        message = serial.loads(blob)
        expiry = message.properties.message_expiry_interval
        if expiry is not None:
            message = dataclasses.replace(message, expires_at_ms=now_ms() + expiry * 1000)
        self._publish(message, username, peer)

    def _later(self, client_id: str, delay_s: float, fire: Callable[[], object]) -> None:
        self._cancel(client_id)

        def due() -> None:
            self._timers.pop(client_id, None)
            fire()

        self._timers[client_id] = self.loop.call_later(delay_s, due)

    def _cancel(self, client_id: str) -> None:
        handle = self._timers.pop(client_id, None)
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

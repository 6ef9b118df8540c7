"""Session ownership in one process's memory, with the Redis store's semantics.

Epochs and event versions are hybrid logical clocks: the next value is
max(previous + 1, wall-clock microseconds). They stay strictly increasing for
a client even after its session was discarded and recreated, so a stale
owner's epoch never becomes valid again and event consumers never see a
version go backwards. Per-client message state (see `services.queue.memory`)
hangs off the same record, so a clean start or an expiry drops it in the
same step, as the Redis scripts do with the client's hash-tagged keys.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from services.session.api import Adopted, Claim, SessionInfo, StoredWill
from services.store.records import ClientRecord, ClientRecords, hlc_next

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never"


class MemorySessionStore(ClientRecords):
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        super().__init__(clock)
        self._wall_us = wall_us
        self._topic_versions: dict[str, int] = {}

    async def claim(self, client_id: str, node: str, clean_start: bool, expiry_s: int) -> Claim:
        rec = self.record(client_id)
        present = rec is not None and not clean_start
        previous = rec.node if rec is not None and rec.online else None
        if rec is None:
            rec = ClientRecord()
            self._clients[client_id] = rec
            self._leftovers.pop(client_id, None)  # a new session: an expired one's state goes
        elif clean_start:
            rec.queue = None
        rec.epoch = hlc_next(rec.epoch, self._wall_us())
        rec.node, rec.online, rec.expiry_s, rec.expires_at = node, True, expiry_s, None
        return Claim(client_id, rec.epoch, present, previous)

    async def release(self, client_id: str, epoch: int, expiry_s: int) -> None:
        rec = self.check(client_id, epoch)
        if expiry_s <= 0:
            del self._clients[client_id]
            return
        rec.node, rec.online, rec.expiry_s = None, False, expiry_s
        rec.expires_at = None if expiry_s >= NEVER_EXPIRES else self._clock() + expiry_s

    async def next_version(self, client_id: str, epoch: int) -> int:
        rec = self.check(client_id, epoch)
        rec.version = hlc_next(rec.version, self._wall_us())
        return rec.version

    async def next_topic_version(self, topic: str) -> int:
        version = hlc_next(self._topic_versions.get(topic, 0), self._wall_us())
        self._topic_versions[topic] = version
        return version

    async def get(self, client_id: str) -> SessionInfo | None:
        rec = self.record(client_id)
        if rec is None:
            return None
        return SessionInfo(client_id, rec.node, rec.epoch, rec.expiry_s, rec.online)

    async def orphans(self, node: str) -> list[str]:
        return [
            cid
            for cid in list(self._clients)
            if (rec := self.record(cid)) is not None and rec.online and rec.node == node
        ]

    async def adopt(self, client_id: str, dead: str) -> Adopted | None:
        rec = self.record(client_id)
        if rec is None or not rec.online or rec.node != dead:
            return None
        now_us = self._wall_us()
        rec.epoch = hlc_next(rec.epoch, now_us)
        rec.version = hlc_next(rec.version, now_us)
        adopted = Adopted(client_id, rec.epoch, rec.version, rec.expiry_s)
        if rec.expiry_s <= 0:
            del self._clients[client_id]
        else:
            rec.node, rec.online = None, False
            never = rec.expiry_s >= NEVER_EXPIRES
            rec.expires_at = None if never else self._clock() + rec.expiry_s
        return adopted

    def mark_durable(self, client_id: str) -> None:
        return None  # one tier: nothing to choose

    async def close(self) -> None:
        return None


class MemoryWillStore:
    """Wills in one process's memory, with the Redis store's semantics."""

    def __init__(self) -> None:
        self._wills: dict[str, tuple[StoredWill, str]] = {}  # client -> (will, token)

    async def put(
        self,
        client_id: str,
        node: str,
        token: str,
        message: bytes | None,
        delay_s: int,
        username: str | None = None,
        peer: str = "",
    ) -> StoredWill | None:
        old = self._wills.pop(client_id, None)
        if message is not None:
            will = StoredWill(message, delay_s, node, 0, username, peer)
            self._wills[client_id] = (will, token)
        return None if old is None else old[0]

    async def arm(self, client_id: str, token: str, due_ms: int) -> bool:
        cur = self._wills.get(client_id)
        if cur is None or cur[1] != token:
            return False
        will = cur[0]
        self._wills[client_id] = (dataclasses.replace(will, due_ms=due_ms), token)
        return True

    async def take(self, client_id: str, token: str) -> bytes | None:
        cur = self._wills.get(client_id)
        if cur is None or cur[1] != token:
            return None
        del self._wills[client_id]
        return cur[0].message

    async def orphans(self, node: str) -> list[str]:
        return [cid for cid, (will, _) in self._wills.items() if will.node == node]

    async def adopt(
        self, client_id: str, dead: str, node: str, token: str, now_ms: int
    ) -> StoredWill | None:
        cur = self._wills.get(client_id)
        if cur is None or cur[0].node != dead:
            return None
        will = cur[0]
        due = will.due_ms or now_ms + will.delay_s * 1000
        adopted = dataclasses.replace(will, node=node, due_ms=due)
        self._wills[client_id] = (adopted, token)
        return adopted

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

import time
from collections.abc import Callable

from services.session.api import Claim, SessionInfo
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

    def mark_durable(self, client_id: str) -> None:
        return None  # one tier: nothing to choose

    async def close(self) -> None:
        return None

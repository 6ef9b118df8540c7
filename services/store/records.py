"""Per-client records in one process's memory: what the memory session and queue
stores share, as the Redis ones share a client's hash-tagged keys.

A record lives until its session ends or expires; the queue store hangs its
state off the record (`queue`), so a clean start or an expiry drops it in
the same step, as the Redis scripts do with the client's keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.store.errors import Fenced


def hlc_next(previous: int, now_us: int) -> int:
    return max(previous + 1, now_us)


@dataclass(slots=True)
class ClientRecord:
    epoch: int = 0
    version: int = 0
    node: str | None = None
    online: bool = False
    expiry_s: int = 0
    expires_at: float | None = None  # monotonic seconds while offline
    queue: object | None = None  # owned by services.queue.memory


class ClientRecords:
    """The live records by client id; a record past its expiry is gone."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._clients: dict[str, ClientRecord] = {}

    def record(self, client_id: str) -> ClientRecord | None:
        """The live record of a client (None if absent or expired)."""
        rec = self._clients.get(client_id)
        if rec is not None and rec.expires_at is not None and self._clock() >= rec.expires_at:
            del self._clients[client_id]
            return None
        return rec

    def check(self, client_id: str, epoch: int) -> ClientRecord:
        rec = self.record(client_id)
        if rec is None or rec.epoch != epoch:
            raise Fenced(client_id)
        return rec

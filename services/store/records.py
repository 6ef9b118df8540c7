"""Per-client records in one process's memory: what the memory session and queue
stores share, as the Redis ones share a client's hash-tagged keys.

A record lives until its session ends or expires; the queue store hangs its
state off the record (`queue`), so a clean start or an expiry drops it in
the same step, as the Redis scripts do with the client's keys. An expired
record's message state is kept aside for LEFTOVER_GRACE_S (`leftover`), as
the Redis message keys outlive the session hash, so the node that logs the
expiry can still hand a shared member's copies to the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.store.errors import Fenced

LEFTOVER_GRACE_S = 60.0  # an expired session's message state is kept this long (see above)


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
        self._leftovers: dict[str, tuple[float, object]] = {}  # expired: (kept until, queue)

    def record(self, client_id: str) -> ClientRecord | None:
        """The live record of a client (None if absent or expired)."""
        rec = self._clients.get(client_id)
        if rec is not None and rec.expires_at is not None and self._clock() >= rec.expires_at:
            del self._clients[client_id]
            self._forget_old_leftovers()
            if rec.queue is not None:
                self._leftovers[client_id] = (self._clock() + LEFTOVER_GRACE_S, rec.queue)
            return None
        return rec

    def leftover(self, client_id: str) -> object | None:
        """Take the message state of a client whose session expired (once; None
        if it had none, was taken, or its grace passed)."""
        self.record(client_id)  # an expiry due now moves it aside first
        kept = self._leftovers.pop(client_id, None)
        return None if kept is None or kept[0] <= self._clock() else kept[1]

    def _forget_old_leftovers(self) -> None:
        now = self._clock()
        while self._leftovers:  # in order of expiry: the oldest first
            client_id, (until, _) = next(iter(self._leftovers.items()))
            if until > now:
                return
            del self._leftovers[client_id]

    def check(self, client_id: str, epoch: int) -> ClientRecord:
        rec = self._clients.get(client_id)  # per message: `record` only if it may have expired
        if rec is not None and rec.expires_at is not None:
            rec = self.record(client_id)
        if rec is None or rec.epoch != epoch:
            raise Fenced(client_id)
        return rec

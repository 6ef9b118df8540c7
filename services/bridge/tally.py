"""How a Kafka bridge (`services.bridge.kafka`) knows what Kafka took: per
loop turn in sync mode (`Turn`: the future the turn's publishers wait on),
by counting in async mode (`Counted`: no report per record)."""

from __future__ import annotations

import asyncio

from confluent_kafka import KafkaError


class Turn:
    """Sync mode: the records one bridge produced in one loop turn share one
    future, True once Kafka acknowledged all of them, False if it refused
    any (so every message of that turn gets 0x80 / a disconnect and is
    resent: duplicates, never a loss). One future per turn, not per message:
    under load a turn carries dozens of records."""

    __slots__ = ("future", "left", "ok", "open")

    def __init__(self, future: asyncio.Future[bool]) -> None:
        self.future = future
        self.left = 0  # records produced and not yet reported
        self.ok = True
        self.open = True  # records of this turn may still be added

    def settle(self) -> None:
        if not self.open and self.left == 0 and not self.future.done():
            self.future.set_result(self.ok)


Report = tuple[Turn | None, int, int, "KafkaError | None"]


class Counted:
    """Async mode's figures without a report per record: Kafka acknowledged
    what was produced and neither failed nor is still held by librdkafka
    (`len(producer)`, which counts its queued events too: the bridge caps it
    by what was produced and is neither failed nor known acknowledged, and
    `stats` keeps `records` from going back). Bytes are records times the
    mean size of the records produced (exact when they are alike)."""

    __slots__ = ("failed", "produced", "produced_bytes")

    def __init__(self) -> None:
        self.produced = self.produced_bytes = 0  # loop
        self.failed = 0  # a report's callback: the loop, a purge or the closing flush

    def mean(self) -> float:
        return self.produced_bytes / self.produced if self.produced else 0.0

    def acknowledged(self, held: int) -> int:
        """Records acknowledged, `held` being what the producers hold (read first:
        a failure counted in between then counts twice, never not at all)."""
        return self.produced - self.failed - held

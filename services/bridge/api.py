"""What the broker sees of the data bridges: one `Egress`, and its figures.

The node that receives a PUBLISH from its client hands it to the egress
(`services.broker.dispatch`); each message is bridged there and nowhere
else, so once cluster-wide without any coordination between nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from services.mqtt.packets import Message

Bridged: TypeAlias = "asyncio.Future[bool] | bool"  # what `Egress.publish` gives (see there)


@dataclass(frozen=True, slots=True)
class BridgeStats:
    """One bridge's figures since the node started, as plain integers."""

    name: str
    records: int  # acknowledged by Kafka
    bytes: int  # key + value bytes of those records
    failures: int  # records Kafka did not take in time (sync publishers got 0x80)
    dropped: int  # records never produced: the buffer was full or the producer failed
    buffered_records: int  # produced, not yet acknowledged (lost if the node dies now)
    buffered_bytes: int
    latency_us_total: int  # produce to Kafka's acknowledgement, summed over `records`
    latency_us_max: int


class Egress(Protocol):
    def publish(self, message: Message, username: str | None) -> Bridged:
        """Hand `message` (received from client `message.sender`, user
        `username`) to every bridge whose filter matches its topic. False: no
        bridge matched; True: only async ones, nothing to wait for. Else a
        future: True once Kafka acknowledged the record of every sync bridge,
        False as soon as one failed or was refused (the publisher's PUBACK /
        PUBREC then says 0x80, a 3.x publisher is disconnected)."""
        ...

    def stats(self) -> list[BridgeStats]:
        """Every bridge's figures, in the order of the config file."""
        ...


def all_true(futures: Sequence[asyncio.Future[bool]]) -> asyncio.Future[bool]:
    """True once every future is True; False as soon as one is False."""
    out: asyncio.Future[bool] = futures[0].get_loop().create_future()
    left = len(futures)

    def done(fut: asyncio.Future[bool]) -> None:
        nonlocal left
        if out.done():
            return
        if fut.cancelled() or fut.exception() is not None or not fut.result():
            out.set_result(False)
            return
        left -= 1
        if left == 0:
            out.set_result(True)

    for fut in futures:
        fut.add_done_callback(done)
    return out

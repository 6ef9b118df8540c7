"""What the node sees of the data bridges: one `Egress`, and their figures.

The node that receives a PUBLISH from its client hands it to the egress
(`services.broker.dispatch`); each message is bridged there and nowhere
else, so once cluster-wide without any coordination between nodes. The
other way (`services.bridge.ingress`) each bridge is given the broker's
`Publish` when the node builds it. Every bridge reports its figures as one
`BridgeStats`, plain integers taken when asked (the metrics scrape, the
management API), never kept up to date anywhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from services.mqtt.packets import Message

Bridged: TypeAlias = "asyncio.Future[bool] | bool"  # what `Egress.publish` gives (see there)
# A message into MQTT (`services.broker.inside`): True once routed and stored.
Publish: TypeAlias = "Callable[[Message], asyncio.Future[bool]]"

OUT = "out"  # MQTT -> Kafka ([[bridge.kafka_out]])
IN = "in"  # Kafka -> MQTT ([[bridge.kafka_in]])


@dataclass(frozen=True, slots=True)
class BridgeStats:
    """One bridge's figures since the node started, as plain integers, and its
    state (`services.bridge.health`: running, kafka_down, stopped). Out: records
    to Kafka; in: records from Kafka published into MQTT."""

    name: str
    records: int  # out: acknowledged by Kafka; in: published and routed
    bytes: int  # out: key + value bytes of those records; in: payload bytes
    failures: int  # out: records Kafka did not take in time (sync publishers got 0x80);
    #   in: publishes that failed (the store or the log): published again, later
    dropped: int  # out: never produced (buffer full, producer failed);
    #   in: records that rendered no valid MQTT topic, skipped
    buffered_records: int  # out: produced, not yet acknowledged (lost if the node dies now);
    #   in: handed to MQTT, not yet routed (consumed again if the node dies now)
    buffered_bytes: int
    latency_us_total: int = 0  # out, sync: produce to Kafka's acknowledgement, over `records`
    latency_us_max: int = 0
    lag: int = 0  # in: records in the assigned partitions past the committed offsets
    direction: str = OUT
    state: str = "running"

    def figures(self) -> dict[str, int]:
        """The integer figures of its direction by name (the metrics and the API)."""
        skip = ONLY_IN if self.direction == OUT else ONLY_OUT
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.type == "int" and f.name not in skip}  # fmt: skip


ONLY_OUT = frozenset({"latency_us_total", "latency_us_max"})
ONLY_IN = frozenset({"lag"})


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

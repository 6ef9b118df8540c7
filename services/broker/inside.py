"""Publishers inside the node: messages that no client sent (a Kafka -> MQTT
bridge, `services.bridge.ingress`) down a client QoS 1 PUBLISH's path.

Theory of operation. `InsidePublish.publish` routes a message as dispatch
routes a client's authorized PUBLISH (no ACL and no message.publish hook:
the operator's bridge table chose the topic): to every subscriber, its
durable copies stored for persistent ones in this loop turn's batch
(`delivery`), a retained one appended to the log. Where a client gets its
PUBACK once that is done, the caller gets a future: True then, False if the
store or the log failed or a full queue refused a copy. The message is not
handed to the data bridges' egress (no loop from Kafka back to Kafka) nor
counted as a client's PUBLISH.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from services.broker.delivery import Delivery
from services.broker.dispatch import Dispatch
from services.metrics.registry import Metrics
from services.mqtt.packets import Message


class Inside:
    """The answer a `Delivery.token` gives a publisher inside the node."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[bool]) -> None:
        self.future = future

    def routed(
        self, token: int, ok: bool, no_subscribers: bool, reason_code: int | None = None
    ) -> None:
        if not self.future.done():
            self.future.set_result(ok and reason_code is None)

    def close(self) -> None:  # a fenced QoS 2 mark; an inside message carries none
        if not self.future.done():
            self.future.set_result(False)


class InsidePublish:
    def __init__(
        self,
        *,
        dispatch: Dispatch,
        delivery: Delivery,
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
    ) -> None:
        self.dispatch = dispatch
        self.delivery = delivery
        self.metrics = metrics
        self.loop = loop
        self.spawn = spawn

    def publish(self, message: Message) -> asyncio.Future[bool]:
        """Route `message`; the future says whether it was (see the module docstring)."""
        inside = Inside(self.loop.create_future())
        since = self.delivery.batched
        gate: asyncio.Future[bool] | None = None
        if message.retain:
            gate = self.loop.create_future()
            delivered = self.dispatch.publish_message(message, store_retained=False)
            self.spawn(self.dispatch.retain_gate(message, gate))
        else:
            delivered = self.dispatch.publish_message(message)
        if not delivered:
            self.metrics.messages_dropped["no_subscribers"] += 1
        self.delivery.token(inside, 0, delivered == 0, gate, since=since)
        return inside.future

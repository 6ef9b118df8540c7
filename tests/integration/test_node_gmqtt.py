"""gmqtt (asyncio, MQTT 5) against a node running in its own thread."""

from __future__ import annotations

import asyncio
from typing import Any

import gmqtt

from tests.integration.conftest import NodeRunner

WAIT_S = 5.0


class Gm:
    def __init__(self, client_id: str, **kw: Any) -> None:
        self.client = gmqtt.Client(client_id, **kw)
        self.messages: asyncio.Queue[tuple[str, bytes, int, dict[str, Any]]] = asyncio.Queue()
        self.disconnected = asyncio.Event()
        self.client.on_message = self._on_message
        self.client.on_disconnect = lambda c, packet, exc=None: self.disconnected.set()

    def _on_message(self, client: Any, topic: str, payload: bytes, qos: int, props: Any) -> int:
        self.messages.put_nowait((topic, payload, qos, props))
        return 0

    async def connect(self, port: int) -> Gm:
        await asyncio.wait_for(self.client.connect("127.0.0.1", port, keepalive=30), WAIT_S)
        return self

    async def message(self) -> tuple[str, bytes, int, dict[str, Any]]:
        return await asyncio.wait_for(self.messages.get(), WAIT_S)


async def test_gmqtt_qos1_and_user_properties(node: NodeRunner) -> None:
    sub = await Gm("gsub").connect(node.mqtt_port)
    pub = await Gm("gpub").connect(node.mqtt_port)
    try:
        sub.client.subscribe("g/#", qos=1, subscription_identifier=7)
        # gmqtt gives no SUBACK hook that is easy to await: a retained probe proves the
        # subscription is in place before the real publish.
        for _ in range(50):
            pub.client.publish("g/probe", b"p", qos=1)
            try:
                topic, _, _, _ = await asyncio.wait_for(sub.messages.get(), 0.1)
            except TimeoutError:
                continue
            if topic == "g/probe":
                break
        while not sub.messages.empty():
            sub.messages.get_nowait()
        pub.client.publish("g/x", b"hello", qos=1, user_property=[("k", "v")], content_type="t")
        topic, payload, qos, props = await sub.message()
        assert (topic, payload, qos) == ("g/x", b"hello", 1)
        assert props.get("user_property") == [("k", "v")]
        assert props.get("content_type") == ["t"]
        assert props.get("subscription_identifier") == [7]
    finally:
        await pub.client.disconnect()
        await sub.client.disconnect()


async def test_gmqtt_will_delay_cancelled_by_resume(node: NodeRunner) -> None:
    watcher = await Gm("watch").connect(node.mqtt_port)
    try:
        watcher.client.subscribe("gw/#", qos=0)
        will = gmqtt.Message("gw/dead", b"bye", will_delay_interval=60)
        c = Gm("willy", will_message=will, session_expiry_interval=120, clean_session=False)
        await c.connect(node.mqtt_port)
        transport = c.client._connection._transport
        transport.abort()
        again = await Gm("willy", session_expiry_interval=120, clean_session=False).connect(
            node.mqtt_port
        )
        pub = await Gm("p2").connect(node.mqtt_port)
        pub.client.publish("gw/alive", b"x")
        topic, _, _, _ = await watcher.message()
        assert topic == "gw/alive"  # the delayed will did not go out
        await again.client.disconnect()
        await pub.client.disconnect()
    finally:
        await watcher.client.disconnect()

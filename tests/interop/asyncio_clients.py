"""gmqtt and amqtt's client: asyncio-native MQTT clients, in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from importlib.metadata import version
from typing import Any

import gmqtt
from amqtt.client import MQTTClient

from tests.interop.api import (
    Broker,
    Burst,
    ClientFailed,
    ConnectSpec,
    Msg,
    Props,
    Unsupported,
)
from tests.interop.inbox import Inbox

CONNECT_S = 10.0
ACK_S = 60.0


def _first(props: dict[str, Any], name: str) -> Any:
    values = props.get(name)
    return values[0] if values else None


class GmqttConn:
    def __init__(self, client: gmqtt.Client, inbox: Inbox, present: bool) -> None:
        self.client, self.inbox, self.session_present = client, inbox, present
        self.dropped = 0
        self.ending = False

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        subscribed = asyncio.get_running_loop().create_future()
        self.client.on_subscribe = lambda *_: subscribed.done() or subscribed.set_result(None)
        self.client.subscribe(topic_filter, qos)
        await asyncio.wait_for(subscribed, CONNECT_S)

    def _send(
        self, topic: str, payload: bytes, qos: int, retain: bool, props: Props | None
    ) -> None:
        kwargs: dict[str, Any] = {}
        if props is not None:
            if props.user_properties:
                kwargs["user_property"] = list(props.user_properties)
            for ours, theirs in (
                ("message_expiry", "message_expiry_interval"),
                ("response_topic", "response_topic"),
                ("correlation_data", "correlation_data"),
                ("content_type", "content_type"),
                ("topic_alias", "topic_alias"),
            ):
                if getattr(props, ours) is not None:
                    kwargs[theirs] = getattr(props, ours)
        self.client.publish(topic, payload, qos, retain, **kwargs)

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        self._send(topic, payload, qos, retain, props)
        # gmqtt has no per-message callback: its store of unacknowledged
        # PUBLISHes empties on the last PUBACK / PUBCOMP.
        await asyncio.wait_for(self.client._persistent_storage.wait_empty(), ACK_S)

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        # gmqtt allocates packet ids up to the broker's Receive Maximum and raises
        # past it: a burst goes as fast as that lets it, as an application's would.
        # It drops a refused QoS 2 message (PUBREC >= 0x80) with a log line only.
        storage = self.client._persistent_storage
        for i in range(count):
            while True:
                try:
                    self._send(topic, b"%d" % i, qos, False, None)
                    break
                except OverflowError:
                    await asyncio.wait_for(storage.wait_empty(), ACK_S)
        await asyncio.wait_for(storage.wait_empty(), ACK_S)
        return Burst((None,) * count)

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        return await self.inbox.take(count, timeout)

    async def disconnects(self) -> int:
        return self.dropped

    async def drop(self) -> None:
        self.ending = True
        self.client._connection._transport.abort()  # gmqtt has no abrupt close of its own

    async def end(self) -> None:
        self.ending = True
        await self.client.disconnect()


class Gmqtt:
    """gmqtt (asyncio) over TCP and TLS, 3.1.1 and 5.0; it has no WebSocket transport."""

    name = "gmqtt"

    def __init__(self) -> None:
        self.version = version("gmqtt")
        self._conns: list[GmqttConn] = []

    async def connect(self, broker: Broker, spec: ConnectSpec) -> GmqttConn:
        if spec.transport == "ws":
            raise Unsupported("gmqtt has no WebSocket transport")
        v5 = spec.version in (None, 5)
        kwargs: dict[str, Any] = {}
        if v5 and spec.session_expiry:
            kwargs["session_expiry_interval"] = spec.session_expiry
        will = None
        if spec.will is not None:
            will = gmqtt.Message(spec.will.topic, spec.will.payload, qos=spec.will.qos)
        client = gmqtt.Client(spec.client_id, clean_session=spec.clean, will_message=will, **kwargs)
        client.set_config({"reconnect_retries": 0})
        inbox = Inbox()
        connack = asyncio.get_running_loop().create_future()

        def on_message(_c: Any, topic: str, payload: bytes, qos: int, props: dict[str, Any]) -> int:
            inbox.put(
                Msg(
                    topic,
                    bytes(payload),
                    qos,
                    bool(props.get("retain")),
                    Props(
                        user_properties=tuple(props.get("user_property") or ()),
                        message_expiry=_first(props, "message_expiry_interval"),
                        response_topic=_first(props, "response_topic"),
                        correlation_data=_first(props, "correlation_data"),
                        content_type=_first(props, "content_type"),
                    ),
                )
            )
            return 0

        def on_connect(_c: Any, flags: int, rc: int, _props: Any) -> None:
            if not connack.done():
                connack.set_result(bool(flags))

        client.on_message = on_message
        client.on_connect = on_connect
        ctx = ssl.create_default_context(cafile=broker.cafile) if spec.transport == "tls" else False
        port = broker.tls_port if spec.transport == "tls" else broker.port
        version_ = gmqtt.constants.MQTTv50 if v5 else gmqtt.constants.MQTTv311
        try:
            await client.connect(broker.host, port, ssl=ctx, keepalive=30, version=version_)
        except Exception as exc:
            raise ClientFailed(f"gmqtt connect: {exc!r}") from exc
        conn = GmqttConn(client, inbox, await asyncio.wait_for(connack, CONNECT_S))

        def on_disconnect(*_: Any) -> None:
            if not conn.ending:
                conn.dropped += 1

        client.on_disconnect = on_disconnect
        self._conns.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self._conns:
            if not conn.ending:
                with contextlib.suppress(Exception):
                    await conn.end()


class AmqttConn:
    def __init__(self, client: MQTTClient) -> None:
        self.client = client
        self.session_present: bool | None = None  # amqtt keeps CONNACK's flag to itself
        self.inbox = Inbox()
        self.ended = False
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            m = await self.client.deliver_message()
            if m is None:
                return
            retain = bool(m.publish_packet.retain_flag) if m.publish_packet else False
            self.inbox.put(Msg(m.topic, bytes(m.data or b""), m.qos or 0, retain))

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        granted = await self.client.subscribe([(topic_filter, qos)])
        if granted[0] >= 0x80:
            raise ClientFailed(f"SUBACK 0x{granted[0]:02X}")

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        if props is not None or not topic:
            raise Unsupported("amqtt speaks MQTT 3.1.1 only: no PUBLISH properties")
        await asyncio.wait_for(self.client.publish(topic, payload, qos, retain), ACK_S)

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        sent = [self.client.publish(topic, b"%d" % i, qos) for i in range(count)]
        outcomes = await asyncio.wait_for(asyncio.gather(*sent, return_exceptions=True), ACK_S)
        return Burst(tuple(None if not isinstance(o, BaseException) else repr(o) for o in outcomes))

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        return await self.inbox.take(count, timeout)

    async def disconnects(self) -> int:
        return int(self._reader.done() and not self.ended)

    async def drop(self) -> None:
        self.ended = True
        self._reader.cancel()
        handler = self.client._handler  # amqtt has no abrupt close of its own
        stream = getattr(handler and handler.writer, "_writer", None)  # TCP and TLS
        if stream is None:
            raise Unsupported("amqtt's writer hides its transport")
        stream.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.disconnect(), 2)

    async def end(self) -> None:
        self.ended = True
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        await self.client.disconnect()


class Amqtt:
    """amqtt's MQTTClient (asyncio; MQTT 3.1.1 only) over TCP, TLS and WebSocket."""

    name = "amqtt"

    def __init__(self) -> None:
        self.version = version("amqtt")
        self._conns: list[AmqttConn] = []

    async def connect(self, broker: Broker, spec: ConnectSpec) -> AmqttConn:
        if spec.version == 5:
            raise Unsupported("amqtt speaks MQTT 3.1.1 only")
        config: dict[str, Any] = {"auto_reconnect": False, "keep_alive": 30}
        if spec.will is not None:
            config["will"] = {
                "topic": spec.will.topic,
                "message": spec.will.payload.decode(),
                "qos": spec.will.qos,
                "retain": False,
            }
        client = MQTTClient(client_id=spec.client_id, config=config)
        url = broker.url(spec.transport)
        cafile = broker.cafile if spec.transport == "tls" else None
        try:
            await asyncio.wait_for(client.connect(url, cleansession=spec.clean, cafile=cafile), 10)
        except Exception as exc:
            raise ClientFailed(f"amqtt connect: {exc!r}") from exc
        conn = AmqttConn(client)
        self._conns.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self._conns:
            if not conn.ended:
                with contextlib.suppress(Exception):
                    await conn.end()


__all__ = ["Amqtt", "Gmqtt", "Unsupported"]

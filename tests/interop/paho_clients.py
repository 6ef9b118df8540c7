"""paho-mqtt (its own network thread) and aiomqtt (asyncio, paho inside) adapters.

paho calls back on its thread; every callback is handed to the test's event
loop (`call_soon_threadsafe`), so the adapter's state is touched by one
thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from importlib.metadata import version
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.interop.api import (
    REFUSED,
    Broker,
    Burst,
    ClientFailed,
    ConnectSpec,
    Msg,
    Props,
    Unsupported,
)
from tests.interop.inbox import Inbox

CALLBACKS: Any = mqtt.CallbackAPIVersion.VERSION2  # type: ignore[attr-defined]
CONNECT_S = 10.0
QUOTA_EXCEEDED = 0x97


def paho_props(p: Props | None) -> Properties | None:
    if p is None:
        return None
    out: Any = Properties(PacketTypes.PUBLISH)
    if p.user_properties:
        out.UserProperty = list(p.user_properties)
    if p.message_expiry is not None:
        out.MessageExpiryInterval = p.message_expiry
    if p.response_topic is not None:
        out.ResponseTopic = p.response_topic
    if p.correlation_data is not None:
        out.CorrelationData = p.correlation_data
    if p.content_type is not None:
        out.ContentType = p.content_type
    if p.topic_alias is not None:
        out.TopicAlias = p.topic_alias
    return out  # type: ignore[no-any-return]


def from_paho(m: Any) -> Msg:
    p = getattr(m, "properties", None)

    def get(name: str) -> Any:
        return getattr(p, name, None) if p is not None else None

    return Msg(
        getattr(m.topic, "value", m.topic),  # aiomqtt: a Topic
        bytes(m.payload),
        m.qos,
        bool(m.retain),
        Props(
            user_properties=tuple(get("UserProperty") or ()),
            message_expiry=get("MessageExpiryInterval"),
            response_topic=get("ResponseTopic"),
            correlation_data=get("CorrelationData"),
            content_type=get("ContentType"),
        ),
    )


def connect_properties(spec: ConnectSpec, v5: bool) -> Properties | None:
    if not v5 or not spec.session_expiry:
        return None
    props: Any = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = spec.session_expiry
    return props  # type: ignore[no-any-return]


def _port(broker: Broker, transport: str) -> int:
    return {"tcp": broker.port, "tls": broker.tls_port, "ws": broker.ws_port}[transport]


class PahoConn:
    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.inbox = Inbox()
        self.session_present = False
        self._connack: asyncio.Future[tuple[bool, int]] = loop.create_future()
        self._acks: dict[int, asyncio.Future[int]] = {}
        self._done: dict[int, int] = {}  # acks that came before their waiter
        self._ending = False
        self.dropped = 0
        soon = loop.call_soon_threadsafe
        client.on_connect = lambda _c, _u, flags, rc, _p: soon(self._on_connack, flags, rc)
        client.on_message = lambda _c, _u, m: soon(self.inbox.put, from_paho(m))
        client.on_publish = lambda _c, _u, mid, rc, _p: soon(self._on_ack, mid, int(rc.value))
        client.on_subscribe = lambda _c, _u, mid, rcs, _p: soon(self._on_ack, mid, 0)
        client.on_disconnect = lambda _c, _u, _f, _rc, _p: soon(self._on_disconnect)

    def _on_connack(self, flags: Any, rc: Any) -> None:
        if not self._connack.done():
            self._connack.set_result((bool(flags.session_present), int(rc.value)))

    def _on_ack(self, mid: int, rc: int) -> None:
        fut = self._acks.pop(mid, None)
        if fut is None:
            self._done[mid] = rc
        elif not fut.done():
            fut.set_result(rc)

    def _on_disconnect(self) -> None:
        if not self._ending:
            self.dropped += 1

    async def opened(self) -> PahoConn:
        present, rc = await asyncio.wait_for(self._connack, CONNECT_S)
        if rc:
            raise ClientFailed(f"CONNACK 0x{rc:02X}")
        self.session_present = present
        return self

    def _ack(self, mid: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self.loop.create_future()
        if mid in self._done:
            fut.set_result(self._done.pop(mid))
        else:
            self._acks[mid] = fut
        return fut

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        _rc, mid = self.client.subscribe(topic_filter, qos)
        await asyncio.wait_for(self._ack(mid), CONNECT_S)

    def _send(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> asyncio.Future[int]:
        info = self.client.publish(topic, payload, qos, retain, paho_props(props))
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise ClientFailed(f"paho publish: {mqtt.error_string(info.rc)}")
        return self._ack(info.mid)

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        rc = await asyncio.wait_for(self._send(topic, payload, qos, retain, props), 30)
        if rc >= 0x80:
            raise ClientFailed(f"publish refused: 0x{rc:02X}")

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        sent = [self._send(topic, b"%d" % i, qos) for i in range(count)]
        codes = await asyncio.wait_for(asyncio.gather(*sent), 60)
        return Burst(tuple(_result(rc) for rc in codes))

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        return await self.inbox.take(count, timeout)

    async def disconnects(self) -> int:
        return self.dropped

    async def drop(self) -> None:
        self._ending = True
        sock = self.client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        await asyncio.to_thread(self.client.loop_stop)

    async def end(self) -> None:
        self._ending = True
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)


def _result(rc: int) -> str | None:
    if rc < 0x80:
        return None
    return REFUSED if rc == QUOTA_EXCEEDED else f"0x{rc:02X}"


class Paho:
    """paho-mqtt 2 (threaded loop) over TCP, TLS and WebSocket, 3.1.1 and 5.0."""

    name = "paho"

    def __init__(self) -> None:
        self.version = version("paho-mqtt")
        self._conns: list[PahoConn] = []

    async def connect(self, broker: Broker, spec: ConnectSpec) -> PahoConn:
        v5 = spec.version in (None, 5)
        kwargs: dict[str, Any] = {} if v5 else {"clean_session": spec.clean}
        client = mqtt.Client(
            CALLBACKS,
            client_id=spec.client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            transport="websockets" if spec.transport == "ws" else "tcp",
            **kwargs,
        )
        if spec.transport == "ws":
            client.ws_set_options(path="/mqtt")
        if spec.transport == "tls":
            client.tls_set_context(ssl.create_default_context(cafile=broker.cafile))
        if spec.will is not None:
            client.will_set(spec.will.topic, spec.will.payload, spec.will.qos)
        conn = PahoConn(client, asyncio.get_running_loop())
        self._conns.append(conn)
        client.connect(
            broker.host,
            _port(broker, spec.transport),
            keepalive=30,
            clean_start=spec.clean if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=connect_properties(spec, v5),
        )
        client.loop_start()
        return await conn.opened()

    async def close(self) -> None:
        for conn in self._conns:
            conn._ending = True
            await asyncio.to_thread(conn.client.loop_stop)


class AioConn:
    def __init__(self, client: aiomqtt.Client, present: bool) -> None:
        self.client = client
        self.session_present = present
        self.inbox = Inbox()
        self._reader = asyncio.create_task(self._read())
        self._ended = False

    async def _read(self) -> None:
        with contextlib.suppress(aiomqtt.MqttError):
            async for m in self.client.messages:
                self.inbox.put(from_paho(m))

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        await self.client.subscribe(topic_filter, qos)

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        await self.client.publish(topic, payload, qos, retain, paho_props(props))

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        # aiomqtt does not surface PUBACK / PUBREC reason codes: a refusal looks acked.
        sent = [self.client.publish(topic, b"%d" % i, qos, timeout=60) for i in range(count)]
        outcomes = await asyncio.gather(*sent, return_exceptions=True)
        return Burst(tuple(None if o is None else repr(o) for o in outcomes))

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        return await self.inbox.take(count, timeout)

    async def disconnects(self) -> int:
        return int(self._reader.done() and not self._ended)

    async def drop(self) -> None:
        self._ended = True
        sock = self.client._client.socket()  # aiomqtt has no abrupt close of its own
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._reader.cancel()
        with contextlib.suppress(Exception):
            await self.client.__aexit__(None, None, None)

    async def end(self) -> None:
        self._ended = True
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.client.__aexit__(None, None, None)


class AioMqtt:
    """aiomqtt 2 (asyncio over paho) over TCP, TLS and WebSocket, 3.1.1 and 5.0."""

    name = "aiomqtt"

    def __init__(self) -> None:
        self.version = version("aiomqtt")
        self._conns: list[AioConn] = []

    async def connect(self, broker: Broker, spec: ConnectSpec) -> AioConn:
        v5 = spec.version in (None, 5)
        client = aiomqtt.Client(
            broker.host,
            _port(broker, spec.transport),
            identifier=spec.client_id,
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            clean_session=None if v5 else spec.clean,
            clean_start=spec.clean if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=connect_properties(spec, v5),
            transport="websockets" if spec.transport == "ws" else "tcp",
            websocket_path="/mqtt" if spec.transport == "ws" else None,
            tls_context=ssl.create_default_context(cafile=broker.cafile)
            if spec.transport == "tls"
            else None,
            will=None
            if spec.will is None
            else aiomqtt.Will(spec.will.topic, spec.will.payload, spec.will.qos),
            keepalive=30,
        )
        # aiomqtt keeps CONNACK's session present flag to itself: read it on the way.
        present: list[bool] = []
        paho = client._client
        on_connect = paho.on_connect

        def seen(c: Any, u: Any, flags: Any, rc: Any, p: Any = None) -> None:
            present.append(bool(flags.session_present))
            on_connect(c, u, flags, rc, p)

        paho.on_connect = seen
        try:
            await asyncio.wait_for(client.__aenter__(), CONNECT_S)
        except aiomqtt.MqttError as exc:
            raise ClientFailed(f"aiomqtt connect: {exc}") from exc
        conn = AioConn(client, present[0])
        self._conns.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self._conns:
            if not conn._ended:
                with contextlib.suppress(Exception):
                    await conn.end()


__all__ = ["AioMqtt", "Paho", "Unsupported"]

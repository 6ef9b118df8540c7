"""Conformance with real client libraries: paho-mqtt (3.1.1 and 5.0) and gmqtt (5.0).

The same scenarios an interoperability suite runs (Eclipse Paho's
client_test / client_test5): basic, retained, offline queueing,
overlapping subscriptions, redelivery on reconnect, zero-length client
id, `$` topics, unsubscribe, will, shared subscriptions, request/response,
topic aliases, flow control and WebSocket, each through the library's own
encoder and decoder so that what a real application sees is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from typing import Any

import gmqtt
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as _PahoProps

from tests.integration.conftest import NodeRunner, Paho

PahoProps: Any = _PahoProps
CALLBACK_API: Any = mqtt.CallbackAPIVersion.VERSION2  # type: ignore[attr-defined]
VERSIONS = [pytest.param(False, id="v311"), pytest.param(True, id="v5")]
WAIT_S = 5.0


def connect(clients: list[Paho], node: NodeRunner, cid: str, **kw: Any) -> Paho:
    c = Paho(node.mqtt_port, cid, **kw)
    clients.append(c)
    _flags, rc = c.connack()
    assert rc == 0
    return c


@pytest.mark.parametrize("v5", VERSIONS)
def test_basic_all_qos(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    c = connect(clients, node, "basic", v5=v5)
    granted = c.subscribe("TopicA/#", 2)
    assert [int(getattr(g, "value", g)) for g in granted] == [2]
    for qos in (0, 1, 2):
        c.publish("TopicA/B", b"qos %d" % qos, qos)
    got = [c.message() for _ in range(3)]
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("TopicA/B", b"qos 0", 0),
        ("TopicA/B", b"qos 1", 1),
        ("TopicA/B", b"qos 2", 2),
    ]


@pytest.mark.parametrize("v5", VERSIONS)
def test_retained_messages(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    pub = connect(clients, node, "rpub", v5=v5)
    for qos in (0, 1, 2):
        pub.publish(f"ret/{qos}", b"qos %d" % qos, qos, retain=True)
    pub.publish("ret/0", b"replaced", 1, retain=True)
    sub = connect(clients, node, "rsub", v5=v5)
    sub.subscribe("ret/+", 2)
    got = {m.topic: (m.payload, m.qos, m.retain) for m in [sub.message() for _ in range(3)]}
    assert got == {
        "ret/0": (b"replaced", 1, True),
        "ret/1": (b"qos 1", 1, True),
        "ret/2": (b"qos 2", 2, True),
    }
    for qos in (0, 1, 2):
        pub.publish(f"ret/{qos}", b"", 1, retain=True)
    assert len(sub.before_barrier(pub, "ret/x", 2)) == 3
    late = connect(clients, node, "rlate", v5=v5)
    late.subscribe("ret/+", 2)
    assert late.before_barrier(pub, "ret/x", 2) == []


@pytest.mark.parametrize("v5", VERSIONS)
def test_offline_message_queueing(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    kw: dict[str, Any] = {"clean": False}
    if v5:
        kw["session_expiry"] = 99999
    sub = connect(clients, node, "offq", v5=v5, **kw)
    sub.subscribe("off/+", 2)
    sub.close()
    pub = connect(clients, node, "offp", v5=v5)
    for qos in (0, 1, 2):
        pub.publish("off/x", b"qos %d" % qos, qos)
    again = Paho(node.mqtt_port, "offq", v5=v5, **kw)
    clients.append(again)
    flags, rc = again.connack()
    assert rc == 0 and flags.session_present
    got = [(m.payload, m.qos) for m in again.before_barrier(pub, "off/x", 2)]
    assert [g for g in got if g[1]] == [(b"qos 1", 1), (b"qos 2", 2)]
    assert len(got) in (2, 3)  # QoS 0 may or may not be queued


@pytest.mark.parametrize("v5", VERSIONS)
def test_overlapping_subscriptions(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    c = connect(clients, node, "ovl", v5=v5)
    c.subscribe("Topic/#", 2)
    c.subscribe("Topic/+", 1)
    c.publish("Topic/C", b"overlapping", 2)
    got = c.before_barrier(c, "Topic/barrier/x", 2)  # matches Topic/# only
    assert got, "no delivery"
    if len(got) == 1:
        assert got[0].qos == 2
    else:  # 5.0 allows one copy per subscription
        assert v5 and sorted(m.qos for m in got) == [1, 2]


@pytest.mark.parametrize("v5", VERSIONS)
def test_redelivery_on_reconnect(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    """A QoS 1/2 message not acknowledged before the drop is redelivered."""
    kw: dict[str, Any] = {"clean": False}
    if v5:
        kw["session_expiry"] = 99999
    sub = connect(clients, node, "redel", v5=v5, **kw)
    sub.subscribe("redel/#", 2)
    sub.client.on_message = None  # paho still acks; stop it from seeing anything
    sock = sub.client.socket()
    assert sock is not None
    sub.client.loop_stop()  # nothing is read or acknowledged any more
    pub = connect(clients, node, "redelp", v5=v5)
    pub.publish("redel/1", b"r1", 1)
    pub.publish("redel/2", b"r2", 2)
    sock.close()
    again = Paho(node.mqtt_port, "redel", v5=v5, **kw)
    clients.append(again)
    flags, _ = again.connack()
    assert flags.session_present
    got = sorted((m.payload, m.qos) for m in again.before_barrier(pub, "redel/x", 2))
    assert got == [(b"r1", 1), (b"r2", 2)]


@pytest.mark.parametrize("v5", VERSIONS)
def test_zero_length_client_id(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    c = connect(clients, node, "", v5=v5)
    c.subscribe("zl", 1)
    c.publish("zl", b"anon", 1)
    assert c.message().payload == b"anon"


@pytest.mark.parametrize("v5", VERSIONS)
def test_dollar_topics(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    c = connect(clients, node, "dollar", v5=v5)
    c.subscribe("+/+", 0)
    c.subscribe("#", 0)
    c.publish("$nottobeused/here", b"x", 1)
    c.publish("ok/here", b"y", 1)
    got = c.before_barrier(c, "barrier/x", 1)
    assert [m.topic for m in got] == ["ok/here"]


@pytest.mark.parametrize("v5", VERSIONS)
def test_unsubscribe(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    c = connect(clients, node, "unsub", v5=v5)
    c.subscribe("unA", 2)
    c.subscribe("unB/#", 2)
    done: queue.Queue[Any] = queue.Queue()
    c.client.on_unsubscribe = lambda cl, u, mid, rcs, p: done.put(rcs)
    c.client.unsubscribe("unA")
    rcs = done.get(timeout=WAIT_S)
    if v5:
        assert [int(r.value) for r in rcs] == [0]
    c.publish("unA", b"gone", 1)
    c.publish("unB/x", b"here", 1)
    assert [m.topic for m in c.before_barrier(c, "unB/barrier", 1)] == ["unB/x"]


@pytest.mark.parametrize("v5", VERSIONS)
def test_will_message(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    watcher = connect(clients, node, "wwatch", v5=v5)
    watcher.subscribe("will/#", 2)
    w = connect(clients, node, "wdying", v5=v5, will=("will/topic", b"client not disconnected", 2))
    w.drop()
    m = watcher.message()
    assert (m.topic, m.payload, m.qos) == ("will/topic", b"client not disconnected", 2)


@pytest.mark.parametrize("v5", VERSIONS)
def test_wildcards(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    c = connect(clients, node, "wc", v5=v5)
    c.subscribe("sport/tennis/#", 0)
    c.subscribe("+/+", 0)
    for t in ("sport/tennis", "sport/tennis/player1/ranking", "/finance", "a/b/c"):
        c.publish(t, t.encode(), 1)
    assert sorted(m.topic for m in c.before_barrier(c, "barrier/x", 1)) == [
        "/finance",
        "sport/tennis",
        "sport/tennis/player1/ranking",
    ]


@pytest.mark.parametrize("v5", VERSIONS)
def test_takeover(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    first = connect(clients, node, "takeover", v5=v5)
    first.client.reconnect_delay_set(120, 120)
    connect(clients, node, "takeover", v5=v5)
    rc = first.disconnects.get(timeout=WAIT_S)
    if v5:
        assert rc == 0x8E
    else:
        assert rc != 0


@pytest.mark.parametrize("v5", VERSIONS)
def test_websocket(node: NodeRunner, clients: list[Paho], v5: bool) -> None:
    ws = Paho(node.ws_port, "ws", v5=v5, transport="websockets")
    clients.append(ws)
    assert ws.connack()[1] == 0
    ws.subscribe("ws/#", 2)
    tcp = connect(clients, node, "wstcp", v5=v5)
    tcp.publish("ws/in", b"to-ws", 2)
    big = bytes(range(256)) * 300
    ws.publish("ws/self", big, 1)
    got = {m.topic: m.payload for m in [ws.message(), ws.message()]}
    assert got == {"ws/in": b"to-ws", "ws/self": big}


def test_websocket_subprotocol_is_mqtt(node: NodeRunner) -> None:
    import base64
    import os
    import socket

    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", node.ws_port), timeout=WAIT_S) as s:
        s.sendall(request.encode())
        head = b""
        deadline = time.monotonic() + WAIT_S
        while b"\r\n\r\n" not in head and time.monotonic() < deadline:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    lines = head.decode("latin-1").lower().split("\r\n")
    assert lines[0].startswith("http/1.1 101")
    assert "sec-websocket-protocol: mqtt" in lines


# --- 5.0 only, paho ------------------------------------------------------------


class Paho5:
    """A paho 5.0 client with arbitrary CONNECT properties."""

    def __init__(self, port: int, cid: str, **connect_props: Any) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.connacks: queue.Queue[Any] = queue.Queue()
        self.subacks: queue.Queue[Any] = queue.Queue()
        self.client = mqtt.Client(CALLBACK_API, client_id=cid, protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda c, u, f, rc, p: self.connacks.put((f, rc, p))
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subacks.put(rcs)
        props = PahoProps(PacketTypes.CONNECT)
        for name, value in connect_props.items():
            setattr(props, name, value)
        self.client.connect("127.0.0.1", port, properties=props)
        self.client.loop_start()
        _flags, rc, self.connack_props = self.connacks.get(timeout=WAIT_S)
        assert rc == 0

    def subscribe(self, topic: str, qos: int, sub_id: int | None = None) -> None:
        props = None
        if sub_id is not None:
            props = PahoProps(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = sub_id
        self.client.subscribe(topic, qos, properties=props)
        self.subacks.get(timeout=WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def p5s() -> Any:
    made: list[Paho5] = []
    yield made
    for c in made:
        c.close()


def test_paho5_request_response(node: NodeRunner, p5s: list[Paho5]) -> None:
    requester = Paho5(node.mqtt_port, "req")
    responder = Paho5(node.mqtt_port, "resp")
    p5s += [requester, responder]
    responder.subscribe("svc/request", 1)
    requester.subscribe("svc/reply/req", 1)
    props = PahoProps(PacketTypes.PUBLISH)
    props.ResponseTopic = "svc/reply/req"
    props.CorrelationData = b"corr-42"
    props.UserProperty = [("a", "1"), ("a", "2")]
    props.ContentType = "text/plain"
    props.PayloadFormatIndicator = 1
    requester.client.publish("svc/request", b"ping", 1, properties=props).wait_for_publish(WAIT_S)
    req = responder.messages.get(timeout=WAIT_S)
    rp = req.properties
    assert rp.ResponseTopic == "svc/reply/req" and rp.CorrelationData == b"corr-42"
    assert rp.UserProperty == [("a", "1"), ("a", "2")]
    assert rp.ContentType == "text/plain" and rp.PayloadFormatIndicator == 1
    back = PahoProps(PacketTypes.PUBLISH)
    back.CorrelationData = rp.CorrelationData
    responder.client.publish(rp.ResponseTopic, b"pong", 1, properties=back).wait_for_publish(WAIT_S)
    reply = requester.messages.get(timeout=WAIT_S)
    assert (reply.payload, reply.properties.CorrelationData) == (b"pong", b"corr-42")


def test_paho5_flow_control(node: NodeRunner, p5s: list[Paho5]) -> None:
    """The server never has more unacked QoS 1/2 than the client's Receive Maximum,
    checked by holding acks with paho's manual ack mode."""
    c = Paho5(node.mqtt_port, "flow", ReceiveMaximum=3)
    p5s.append(c)
    c.client.manual_ack_set(True)
    c.subscribe("flow/#", 2)
    pub = Paho5(node.mqtt_port, "flowp")
    p5s.append(pub)
    for i in range(8):
        pub.client.publish("flow/x", b"%d" % i, 1 + i % 2).wait_for_publish(WAIT_S)
    held = [c.messages.get(timeout=WAIT_S) for _ in range(3)]
    with pytest.raises(queue.Empty):
        c.messages.get(timeout=0.5)
    got = list(held)
    while len(got) < 8:
        c.client.ack(held[0].mid, held[0].qos)
        held.pop(0)
        m = c.messages.get(timeout=WAIT_S)
        held.append(m)
        got.append(m)
    for m in held:
        c.client.ack(m.mid, m.qos)
    assert sorted(m.payload for m in got) == [b"%d" % i for i in range(8)]


def test_paho5_subscription_identifier_and_expiry(node: NodeRunner, p5s: list[Paho5]) -> None:
    c = Paho5(node.mqtt_port, "sidx")
    p5s.append(c)
    c.subscribe("sx/+", 1, sub_id=5)
    c.subscribe("sx/#", 1, sub_id=6)
    props = PahoProps(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 300
    c.client.publish("sx/a", b"x", 1, properties=props).wait_for_publish(WAIT_S)
    m = c.messages.get(timeout=WAIT_S)
    assert sorted(m.properties.SubscriptionIdentifier) == [5, 6]
    assert 295 <= m.properties.MessageExpiryInterval <= 300


def test_paho5_connack_properties(node: NodeRunner, p5s: list[Paho5]) -> None:
    c = Paho5(node.mqtt_port, "")
    p5s.append(c)
    props = c.connack_props
    assert props.AssignedClientIdentifier
    assert props.ReceiveMaximum >= 1
    for flag in ("WildcardSubscriptionAvailable", "SharedSubscriptionAvailable"):
        assert getattr(props, flag, 1) == 1
    assert getattr(props, "MaximumQoS", 2) == 2


def test_paho5_shared_subscription(node: NodeRunner, p5s: list[Paho5]) -> None:
    members = [Paho5(node.mqtt_port, f"shm{i}") for i in range(2)]
    pub = Paho5(node.mqtt_port, "shpub")
    p5s += [*members, pub]
    for m in members:
        m.subscribe("$share/grp/shared/#", 1)
    n = 20
    for i in range(n):
        pub.client.publish("shared/x", b"%d" % i, 1).wait_for_publish(WAIT_S)
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < n and time.monotonic() < deadline:
        for m in members:
            with contextlib.suppress(queue.Empty):
                got.append(m.messages.get(timeout=0.05).payload)
    for m in members:
        with pytest.raises(queue.Empty):
            m.messages.get(timeout=0.3)
    assert sorted(got) == sorted(b"%d" % i for i in range(n))


# --- 5.0, gmqtt -------------------------------------------------------------


class Gm:
    def __init__(self, client_id: str, **kw: Any) -> None:
        self.client = gmqtt.Client(client_id, **kw)
        self.messages: asyncio.Queue[tuple[str, bytes, int, dict[str, Any]]] = asyncio.Queue()
        self.subacks: asyncio.Queue[Any] = asyncio.Queue()
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda c, mid, qos, props: self.subacks.put_nowait(qos)

    def _on_message(self, client: Any, topic: str, payload: bytes, qos: int, props: Any) -> int:
        self.messages.put_nowait((topic, payload, qos, props))
        return 0

    async def connect(self, port: int, **kw: Any) -> Gm:
        await asyncio.wait_for(self.client.connect("127.0.0.1", port, keepalive=30, **kw), WAIT_S)
        return self

    async def subscribe(self, topic: str, qos: int, **kw: Any) -> None:
        self.client.subscribe(topic, qos=qos, **kw)
        await asyncio.wait_for(self.subacks.get(), WAIT_S)

    async def message(self) -> tuple[str, bytes, int, dict[str, Any]]:
        return await asyncio.wait_for(self.messages.get(), WAIT_S)


async def test_gmqtt_topic_aliases_both_ways(node: NodeRunner) -> None:
    sub = await Gm("gta-sub", topic_alias_maximum=4).connect(node.mqtt_port)
    pub = await Gm("gta-pub").connect(node.mqtt_port)
    try:
        await sub.subscribe("gta/#", 1)
        pub.client.publish("gta/one", b"1", qos=1, topic_alias=1)
        pub.client.publish("", b"2", qos=1, topic_alias=1)
        pub.client.publish("gta/two", b"3", qos=1, topic_alias=2)
        pub.client.publish("", b"4", qos=1, topic_alias=2)
        pub.client.publish("", b"5", qos=1, topic_alias=1)
        got = [(await sub.message())[:2] for _ in range(5)]
        assert got == [
            ("gta/one", b"1"),
            ("gta/one", b"2"),
            ("gta/two", b"3"),
            ("gta/two", b"4"),
            ("gta/one", b"5"),
        ]
    finally:
        await pub.client.disconnect()
        await sub.client.disconnect()


async def test_gmqtt_retain_handling_and_no_local(node: NodeRunner) -> None:
    c = await Gm("gnl").connect(node.mqtt_port)
    try:
        c.client.publish("gnl/r", b"kept", qos=1, retain=True)
        await c.subscribe("gnl/#", 1, no_local=True, retain_handling_options=0)
        topic, payload, _, props = await c.message()
        assert (topic, payload) == ("gnl/r", b"kept")
        assert props.get("retain", 1) == 1
        c.client.publish("gnl/live", b"own", qos=1)
        await c.subscribe("gnl/+", 0, retain_handling_options=2)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(c.messages.get(), 0.4)
        c.client.publish("gnl/r", b"", qos=1, retain=True)
    finally:
        await c.client.disconnect()


async def test_gmqtt_session_expiry_resume(node: NodeRunner) -> None:
    kw: dict[str, Any] = {"session_expiry_interval": 60, "clean_session": False}
    c = await Gm("gse", **kw).connect(node.mqtt_port)
    await c.subscribe("gse/#", 2)
    await c.client.disconnect()
    pub = await Gm("gsep").connect(node.mqtt_port)
    try:
        pub.client.publish("gse/a", b"while-away", qos=2)
        again = await Gm("gse", **kw).connect(node.mqtt_port)
        try:
            topic, payload, qos, _ = await again.message()
            assert (topic, payload, qos) == ("gse/a", b"while-away", 2)
        finally:
            await again.client.disconnect()
    finally:
        await pub.client.disconnect()


def test_websocket_packets_split_and_coalesced_across_frames(node: NodeRunner) -> None:
    """MQTT over WebSocket (6.0): MQTT packets may span WebSocket frames and one
    frame may hold several packets; the server reassembles the byte stream."""
    import socket

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, BytesMessage, Request

    from services.mqtt.codec import decode, encode
    from services.mqtt.packets import Connack, Connect, Publish, Suback, Subscribe, Subscription

    ws = WSConnection(ConnectionType.CLIENT)
    with socket.create_connection(("127.0.0.1", node.ws_port), timeout=WAIT_S) as s:
        s.sendall(ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
        data = bytearray()
        deadline = time.monotonic() + WAIT_S

        def events() -> list[Any]:
            chunk = s.recv(65536)
            assert chunk, "server closed"
            ws.receive_data(chunk)
            return list(ws.events())

        accepted = False
        while not accepted and time.monotonic() < deadline:
            accepted = any(isinstance(e, AcceptConnection) for e in events())
        assert accepted
        connect = encode(Connect("ws-split", protocol_level=4), 4)
        s.sendall(ws.send(BytesMessage(data=connect[:3])))
        s.sendall(ws.send(BytesMessage(data=connect[3:])))
        both = encode(Subscribe(1, (Subscription("wss", 0),)), 4) + encode(
            Publish("wss", b"echo"), 4
        )
        s.sendall(ws.send(BytesMessage(data=both)))
        got: list[Any] = []
        while len(got) < 3 and time.monotonic() < deadline:
            for e in events():
                if isinstance(e, BytesMessage):
                    data += e.data
            while (one := decode(data, 4)) is not None:
                got.append(one[0])
                del data[: one[1]]
        assert [type(p) for p in got] == [Connack, Suback, Publish]
        assert got[2].payload == b"echo"

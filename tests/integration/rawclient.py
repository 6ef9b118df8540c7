"""`Raw`: an MQTT client over a plain socket, on the project codec.

It sends exact (also malformed) packets and reads exactly what the broker
answers, including whether and when it closes the connection: what no client
library will do. Shared by the conformance test files; the `raws` fixture that
closes every `Raw` a test opened lives in conftest.py.
"""

from __future__ import annotations

import itertools
import socket
import time
from typing import Any, Protocol

import pytest

from services.mqtt.codec import decode, encode
from services.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)

WAIT_S = 5.0
V311 = 4
V5 = 5
LEVELS = [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")]
BARRIER_PACKET_ID = 0xFEED  # the sentinel's packet id (tests use small ones)
_SENTINELS = itertools.count(1)  # barrier payloads, unique in a test run


class Listening(Protocol):
    """A node the helpers below can reach: a `NodeRunner` in a thread, or a node
    process (tests/support/live_node.py)."""

    @property
    def mqtt_port(self) -> int: ...


class Closed(Exception):
    """The broker closed the connection."""


class Raw:
    """One MQTT connection over a plain socket, encoded with the project codec."""

    def __init__(self, port: int, level: int = V311) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.level = level
        self.buf = bytearray()
        self.eof = False

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str, **kw: Any) -> Connack:
        self.send(Connect(client_id, protocol_level=self.level, **kw))
        ack = self.recv()
        assert isinstance(ack, Connack), ack
        return ack

    def _fill(self, deadline: float) -> None:
        if self.eof:
            raise Closed
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise Closed
        self.buf += data

    def recv(self, timeout: float = WAIT_S) -> Packet:
        """The next packet; raises Closed at EOF, TimeoutError past `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            got = decode(self.buf, self.level, 1 << 28)
            if got is not None:
                packet, used = got
                del self.buf[:used]
                return packet
            if time.monotonic() >= deadline:
                raise TimeoutError("no packet")
            try:
                self._fill(deadline)
            except TimeoutError:
                raise TimeoutError("no packet") from None

    def before_barrier(self, sender: Raw, topic: str, qos: int = 0) -> list[Packet]:
        """The packets this client gets before a barrier: `sender` (maybe this client)
        publishes a sentinel on `topic`, which this client is subscribed to, and every
        packet ahead of the sentinel PUBLISH is returned (the sentinel's own PUBACK, when
        this client sent it, is not). The sentinel is acknowledged. An absence check
        without a timed wait: `assert sub.before_barrier(pub, "t") == []`.

        It proves what it should only if a packet that must not come would have been on
        its way to this client before the sentinel: the sentinel goes after it on the
        same connection (or after whatever caused it), and at a QoS that does not let it
        overtake: a QoS 0 copy is written at once, a QoS 1/2 copy goes through the
        queue, so where a QoS 1/2 message could come, the sentinel is QoS 1."""
        assert qos in (0, 1)
        sentinel = b"barrier-%d" % next(_SENTINELS)
        packet_id = BARRIER_PACKET_ID if qos else None
        sender.send(Publish(topic, sentinel, qos=qos, packet_id=packet_id))
        own_ack = qos == 1 and sender is self
        if qos and not own_ack:
            assert sender.expect(Puback).packet_id == packet_id
        before: list[Packet] = []
        while True:
            packet = self.recv()
            if isinstance(packet, Publish) and packet.payload == sentinel:
                break
            if own_ack and isinstance(packet, Puback) and packet.packet_id == packet_id:
                own_ack = False
                continue
            before.append(packet)
            assert len(before) < 1000
        if packet.qos == 1:
            assert packet.packet_id is not None
            self.send(Puback(packet.packet_id))
        if own_ack:
            assert self.expect(Puback).packet_id == packet_id
        return before

    def nothing(self, within: float = 0.3) -> bool:
        """True if no packet arrives within `within` seconds (a timed absence check, for
        where `before_barrier` cannot be used)."""
        try:
            self.recv(within)
        except TimeoutError:
            return True
        return False

    def closed(self, timeout: float = WAIT_S) -> list[Packet]:
        """Wait for EOF; return the packets that came before it."""
        before: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                before.append(self.recv(max(0.0, deadline - time.monotonic())))
            except Closed:
                return before
            assert len(before) < 1000

    def subscribe(self, *subs: Subscription, packet_id: int = 1, **kw: Any) -> Suback:
        self.send(Subscribe(packet_id, subs, **kw))
        ack: Suback = self.expect(Suback)
        assert ack.packet_id == packet_id
        return ack

    def expect(self, kind: type[Any], timeout: float = WAIT_S) -> Any:
        """The next packet, which must be of type `kind` (PINGRESPs are skipped)."""
        packet = self.recv(timeout)
        while isinstance(packet, Pingresp) and kind is not Pingresp:
            packet = self.recv(timeout)
        assert isinstance(packet, kind), packet
        return packet

    def close(self) -> None:
        self.sock.close()


def opened(raws: list[Raw], node: Listening, cid: str, level: int = V311, **kw: Any) -> Raw:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    ack = r.connect(cid, **kw)
    assert ack.reason_code == 0, ack
    return r


def assert_alive(raws: list[Raw], node: Listening, level: int = V311) -> None:
    """Another connection still works end to end after someone misbehaved."""
    a = opened(raws, node, f"alive-{len(raws)}", level)
    round_trip(a, "alive/check")


def round_trip(r: Raw, topic: str, packet_id: int = 9) -> None:
    """SUBSCRIBE to `topic` and PUBLISH to it at QoS 1: the PUBACK and the message come."""
    r.subscribe(Subscription(topic, 1), packet_id=packet_id)
    r.send(Publish(topic, b"ok", qos=1, packet_id=packet_id))
    got = [r.recv(), r.recv()]
    kinds = {type(p) for p in got}
    assert kinds == {Puback, Publish}, got


def v5_disconnect_code(packets: list[Packet]) -> int | None:
    codes = [p.reason_code for p in packets if isinstance(p, Disconnect)]
    return codes[-1] if codes else None

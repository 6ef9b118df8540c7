"""Interop: the codec talks to a real Mosquitto at MQTT 3.1, 3.1.1 and 5.0.

Mosquitto must accept every packet the encoder writes (it disconnects on
anything malformed), and the decoder must parse every packet Mosquitto
sends: CONNACK, SUBACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK,
PINGRESP and (5.0) DISCONNECT.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.mqtt.codec import decode, encode
from services.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from services.ports import free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
DEADLINE_S = 5.0

pytestmark = pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto not installed")


@pytest.fixture(scope="module")
def mosquitto_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    conf = tmp_path_factory.mktemp("mosquitto") / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n"
    )
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("mosquitto did not start") from None
                time.sleep(0.02)  # polling a condition with a deadline, not a sync sleep
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)


class Peer:
    def __init__(self, port: int, level: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
        self.level = level
        self.buf = bytearray()

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def receive(self) -> Packet:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            result = decode(self.buf, self.level)
            if result is not None:
                packet, used = result
                del self.buf[:used]
                return packet
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("mosquitto closed the connection")
            self.buf += chunk
        raise TimeoutError("no packet from mosquitto")

    def connect(
        self, client_id: str, clean: bool = True, props: Properties | None = None
    ) -> Connack:
        self.send(
            Connect(
                client_id,
                self.level,
                clean,
                30,
                properties=props or Properties(),
                protocol_name="MQIsdp" if self.level == 3 else "MQTT",
            )
        )
        connack = self.receive()
        assert isinstance(connack, Connack)
        assert connack.reason_code == 0
        return connack

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("level", [3, 4, 5])
def test_full_qos_flows_with_mosquitto(mosquitto_port: int, level: int) -> None:
    sub = Peer(mosquitto_port, level)
    pub = Peer(mosquitto_port, level)
    try:
        sub.connect(f"codec-sub-{level}")
        pub.connect(f"codec-pub-{level}")
        sub.send(Subscribe(1, (Subscription(f"codec/{level}/#", 2),)))
        assert sub.receive() == Suback(1, (2,))

        props = Properties()
        if level == 5:
            props = Properties(
                payload_format_indicator=1,
                content_type="text/plain",
                user_property=(("k", "v"), ("k", "w")),
                correlation_data=b"\x00\x01",
            )
        for qos in (0, 1, 2):
            topic = f"codec/{level}/q{qos}"
            pub.send(
                Publish(
                    topic,
                    f"héllo {qos}".encode(),
                    qos,
                    False,
                    False,
                    10 + qos if qos else None,
                    props,
                )
            )
            if qos == 1:
                assert pub.receive() == Puback(11)
            if qos == 2:
                assert pub.receive() == Pubrec(12)
                pub.send(Pubrel(12))
                assert pub.receive() == Pubcomp(12)
            got = sub.receive()
            assert isinstance(got, Publish)
            assert (got.topic, got.payload, got.qos) == (topic, f"héllo {qos}".encode(), qos)
            if level == 5:
                assert got.properties.user_property == (("k", "v"), ("k", "w"))
                assert got.properties.content_type == "text/plain"
                assert got.properties.correlation_data == b"\x00\x01"
            if qos == 1:
                assert got.packet_id is not None
                sub.send(Puback(got.packet_id))
            if qos == 2:
                assert got.packet_id is not None
                sub.send(Pubrec(got.packet_id))
                assert sub.receive() == Pubrel(got.packet_id)
                sub.send(Pubcomp(got.packet_id))

        sub.send(Unsubscribe(2, (f"codec/{level}/#",)))
        assert sub.receive() == (Unsuback(2, (0,)) if level == 5 else Unsuback(2))
        sub.send(Pingreq())
        assert sub.receive() == Pingresp()
    finally:
        sub.close()
        pub.close()


def test_mosquitto_disconnect_decodes(mosquitto_port: int) -> None:
    peer = Peer(mosquitto_port, 5)
    try:
        connack = peer.connect("codec-alias")
        too_big = (connack.properties.topic_alias_maximum or 10) + 1
        peer.send(Publish("codec/alias", b"", properties=Properties(topic_alias=too_big)))
        assert peer.receive() == Disconnect(0x94)
    finally:
        peer.close()


def test_mosquitto_connack_properties_decode(mosquitto_port: int) -> None:
    peer = Peer(mosquitto_port, 5)
    try:
        connack = peer.connect("", props=Properties(session_expiry_interval=0))
        assert connack.properties.assigned_client_identifier  # mosquitto names us
    finally:
        peer.close()

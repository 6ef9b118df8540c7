"""The few MQTT packets the load generator sends and receives.

Theory of operation: the generator never uses the project's codec, so a bug
there cannot hide behind a bug here. Everything it sends is encoded once,
before the clock starts: a publisher's whole run is one buffer of fixed-size
PUBLISH packets (the topic, payload size and packet id width never change), so
sending N messages is writing one slice of it. The payload opens with the
publisher's number, the message's sequence number and a monotonic timestamp
(`PAYLOAD`), which is how the receiver counts losses, duplicates and latency.

`FrameParser` is incremental: `feed` takes whatever bytes arrived and returns
every complete frame as (first byte, body); a frame cut anywhere, even inside
the remaining-length varint, waits for the rest. A malformed remaining length
raises `ProtocolViolation`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bench.errors import ProtocolViolation

CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBSCRIBE = 0x82
SUBACK = 0x90
PINGREQ = 0xC0
PINGRESP = 0xD0
DISCONNECT = 0xE0

MQTT_311 = 4
MQTT_5 = 5
MAX_REMAINING_LENGTH = 268_435_455

PAYLOAD = struct.Struct(">HIQ")
"""Publisher number, sequence number, send time (time.monotonic_ns)."""


def varint(value: int) -> bytes:
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {value} out of range")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def connect(
    client_id: str,
    *,
    version: int = MQTT_311,
    keepalive: int = 0,
    clean: bool = True,
    session_expiry_s: int = 0,
    username: str | None = None,
    password: bytes | None = None,
) -> bytes:
    """CONNECT; `clean=False` resumes a session (5.0: also give `session_expiry_s` > 0)."""
    flags = (0x02 if clean else 0x00) | (0x80 if username is not None else 0)
    flags |= 0x40 if password is not None else 0
    credentials = _string(username) if username is not None else b""
    if password is not None:
        credentials += len(password).to_bytes(2, "big") + password
    variable = _string("MQTT") + bytes([version, flags]) + keepalive.to_bytes(2, "big")
    if version == MQTT_5:
        if session_expiry_s:
            variable += b"\x05\x11" + session_expiry_s.to_bytes(4, "big")
        else:
            variable += b"\x00"
    return _packet(CONNECT, variable + _string(client_id) + credentials)


def subscribe(packet_id: int, topic_filter: str, qos: int, *, version: int = MQTT_311) -> bytes:
    props = b"\x00" if version == MQTT_5 else b""
    body = packet_id.to_bytes(2, "big") + props + _string(topic_filter) + bytes([qos])
    return _packet(SUBSCRIBE, body)


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


PUBACKS: tuple[bytes, ...] = tuple(puback(i) for i in range(65536))
"""PUBACK for every packet id, so acknowledging is a table lookup. A PUBACK with
only the packet id is valid in MQTT 5 too (reason code 0 omitted)."""

PINGREQ_PACKET = b"\xc0\x00"
DISCONNECT_PACKET = b"\xe0\x00"


def packet_id_for(seq: int) -> int:
    return seq % 65535 + 1


@dataclass(frozen=True, slots=True)
class PublishBatch:
    """A run of PUBLISH packets of one size, back to back in `data`."""

    data: bytes
    size: int
    count: int

    def slice(self, start: int, stop: int) -> memoryview:
        return memoryview(self.data)[start * self.size : stop * self.size]


def publish(
    topic: str,
    payload: bytes,
    *,
    qos: int,
    packet_id: int = 0,
    version: int = MQTT_311,
) -> bytes:
    body = _string(topic)
    if qos:
        body += packet_id.to_bytes(2, "big")
    if version == MQTT_5:
        body += b"\x00"
    return _packet(PUBLISH | qos << 1, body + payload)


def publish_batch(
    topic: str,
    publisher: int,
    first_seq: int,
    count: int,
    *,
    qos: int,
    payload_size: int,
    version: int = MQTT_311,
) -> PublishBatch:
    """`count` PUBLISH packets with sequence numbers from `first_seq`, timestamp 0."""
    padding = bytes(max(0, payload_size - PAYLOAD.size))
    template = publish(topic, PAYLOAD.pack(0, 0, 0) + padding, qos=qos, version=version)
    size = len(template)
    head = template[: size - PAYLOAD.size - len(padding)]
    pid_at = len(head) - (1 if version == MQTT_5 else 0) - 2
    data = bytearray(template * count)
    pack_into = PAYLOAD.pack_into
    payload_at = len(head)
    for i in range(count):
        seq = first_seq + i
        base = i * size
        pack_into(data, base + payload_at, publisher, seq, 0)
        if qos:
            data[base + pid_at : base + pid_at + 2] = packet_id_for(seq).to_bytes(2, "big")
    return PublishBatch(bytes(data), size, count)


def publish_body_offsets(body: bytes | memoryview, qos: int, version: int) -> tuple[int, int]:
    """(packet id or 0, offset of the payload) of a PUBLISH body."""
    at = 2 + int.from_bytes(body[:2], "big")
    packet_id = 0
    if qos:
        packet_id = int.from_bytes(body[at : at + 2], "big")
        at += 2
    if version == MQTT_5:
        props, used = read_varint(body, at)
        at += used + props
    return packet_id, at


def read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """(value, bytes used) of the varint at `at`; (-1, 0) if it is not complete yet."""
    value = 0
    for i in range(4):
        if at + i >= len(data):
            return -1, 0
        byte = data[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, i + 1
    raise ProtocolViolation("remaining length longer than 4 bytes")


class FrameParser:
    """Splits a byte stream into MQTT frames; see the module docstring."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    @property
    def buffered(self) -> int:
        return len(self._pending)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._pending + data if self._pending else data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        end_of_data = len(buf)
        while end_of_data - pos >= 2:
            length = buf[pos + 1]
            start = pos + 2
            if length & 0x80:
                length, used = read_varint(buf, pos + 1)
                if used == 0:
                    break
                start = pos + 1 + used
            end = start + length
            if end > end_of_data:
                break
            frames.append((buf[pos], buf[start:end]))
            pos = end
        self._pending = buf[pos:]
        return frames

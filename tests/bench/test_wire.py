from __future__ import annotations

import pytest

from bench import wire
from bench.errors import ProtocolViolation


def _stream() -> tuple[bytes, list[tuple[int, bytes]]]:
    big_payload = bytes(range(256)) * 2
    packets = [
        b"\x20\x02\x00\x00",
        wire.publish("a/b", b"hello", qos=0),
        wire.publish("a/b", big_payload, qos=1, packet_id=7),
        wire.puback(7),
        b"\x90\x03\x00\x01\x01",
        b"\xd0\x00",
        wire.publish("x", bytes(20_000), qos=1, packet_id=65535),
    ]
    expected = []
    for packet in packets:
        length, used = wire.read_varint(packet, 1)
        expected.append((packet[0], packet[1 + used :]))
        assert len(packet) == 1 + used + length
    return b"".join(packets), expected


def test_varint_golden_bytes() -> None:
    assert wire.varint(0) == b"\x00"
    assert wire.varint(127) == b"\x7f"
    assert wire.varint(128) == b"\x80\x01"
    assert wire.varint(16_383) == b"\xff\x7f"
    assert wire.varint(268_435_455) == b"\xff\xff\xff\x7f"
    with pytest.raises(ValueError):
        wire.varint(268_435_456)


def test_whole_stream_parses_in_one_feed() -> None:
    stream, expected = _stream()
    parser = wire.FrameParser()
    assert parser.feed(stream) == expected
    assert parser.buffered == 0


def test_every_split_point_gives_the_same_frames() -> None:
    stream, expected = _stream()
    for cut in range(len(stream) + 1):
        parser = wire.FrameParser()
        frames = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert frames == expected, f"cut at {cut}"
        assert parser.buffered == 0


def test_byte_by_byte_gives_the_same_frames() -> None:
    stream, expected = _stream()
    parser = wire.FrameParser()
    frames = []
    for i in range(len(stream)):
        frames += parser.feed(stream[i : i + 1])
    assert frames == expected


def test_five_byte_remaining_length_is_a_violation() -> None:
    with pytest.raises(ProtocolViolation):
        wire.FrameParser().feed(b"\x30\xff\xff\xff\xff\x01")


def test_connect_and_subscribe_golden_bytes() -> None:
    assert wire.connect("c1") == b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x00\x00\x02c1"
    assert wire.connect("c1", version=wire.MQTT_5) == (
        b"\x10\x0f\x00\x04MQTT\x05\x02\x00\x00\x00\x00\x02c1"
    )
    assert wire.subscribe(1, "a/+", 1) == b"\x82\x08\x00\x01\x00\x03a/+\x01"
    assert wire.subscribe(1, "a/+", 1, version=wire.MQTT_5) == (
        b"\x82\x09\x00\x01\x00\x00\x03a/+\x01"
    )
    assert wire.PUBACKS[258] == b"\x40\x02\x01\x02"


@pytest.mark.parametrize("version", [wire.MQTT_311, wire.MQTT_5])
@pytest.mark.parametrize("qos", [0, 1])
def test_publish_batch_is_the_packets_one_by_one(qos: int, version: int) -> None:
    batch = wire.publish_batch("t/1", 3, 65_530, 10, qos=qos, payload_size=20, version=version)
    parser = wire.FrameParser()
    frames = parser.feed(batch.data)
    assert len(frames) == batch.count == 10
    for i, (first, body) in enumerate(frames):
        seq = 65_530 + i
        payload = wire.PAYLOAD.pack(3, seq, 0) + bytes(20 - wire.PAYLOAD.size)
        packet_id = wire.packet_id_for(seq)
        assert bytes(batch.slice(i, i + 1)) == wire.publish(
            "t/1", payload, qos=qos, packet_id=packet_id, version=version
        )
        assert first == wire.PUBLISH | qos << 1
        got_id, at = wire.publish_body_offsets(body, qos, version)
        assert got_id == (packet_id if qos else 0)
        assert wire.PAYLOAD.unpack_from(body, at) == (3, seq, 0)
    assert wire.packet_id_for(65_534) == 65_535
    assert wire.packet_id_for(65_535) == 1

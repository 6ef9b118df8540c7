"""Golden bytes for every control packet at every level (tests/support/codec_golden.py).

Each case is (level, bytes, packet): decoding the bytes gives the packet and
uses all of them, and encoding the packet at that level gives the bytes.
"""

from __future__ import annotations

import pytest

from services.mqtt.codec import decode, encode
from services.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Publish,
    Suback,
    Unsuback,
)
from tests.support.codec_golden import GOLDEN, h


def _id(case: tuple[int, bytes, Packet]) -> str:
    level, data, packet = case
    return f"L{level}-{type(packet).__name__}-{data.hex()[:24]}"


@pytest.mark.parametrize("case", GOLDEN, ids=[_id(c) for c in GOLDEN])
def test_golden_decode(case: tuple[int, bytes, Packet]) -> None:
    level, data, packet = case
    assert decode(data, level) == (packet, len(data))


@pytest.mark.parametrize("case", GOLDEN, ids=[_id(c) for c in GOLDEN])
def test_golden_encode(case: tuple[int, bytes, Packet]) -> None:
    level, data, packet = case
    assert encode(packet, level) == data


@pytest.mark.parametrize(
    "case", [c for c in GOLDEN if isinstance(c[2], Connect)],
    ids=[_id(c) for c in GOLDEN if isinstance(c[2], Connect)],
)
def test_connect_decides_its_own_level(case: tuple[int, bytes, Packet]) -> None:
    _, data, packet = case
    assert decode(data, 0) == (packet, len(data))


def test_every_packet_type_has_golden_bytes_at_every_level() -> None:
    seen = {(level, data[0] >> 4) for level, data, _ in GOLDEN}
    wanted = {(level, t) for level in (3, 4, 5) for t in range(1, 15)} | {(5, 15)}
    assert wanted <= seen, sorted(wanted - seen)


def test_large_remaining_length_uses_multi_byte_varint() -> None:
    payload = bytes(range(256)) * 8  # 2048 bytes
    # remaining length 2 + 1 + 2048 = 2051 = 0x803 -> 0x83 0x10
    data = h("30 83 10 00 01 61") + payload
    assert encode(Publish("a", payload), 4) == data
    assert decode(data, 4) == (Publish("a", payload), len(data))


def test_3x_encoding_drops_what_the_level_cannot_say() -> None:
    props = Properties(reason_string="nope")
    assert encode(Puback(10, 0x80, props), 4) == h("40 02 00 0a")
    assert encode(Unsuback(2, (0x11,), props), 4) == h("b0 02 00 02")
    assert encode(Suback(1, (0, 0x87, 0x8F)), 4) == h("90 05 00 01 00 80 80")
    assert encode(Connack(True, 0x86), 4) == h("20 02 01 04")
    assert encode(Connack(False, 0x84), 3) == h("20 02 00 01")
    assert encode(Disconnect(0x8E, props), 4) == h("e0 00")
    assert encode(Publish("a", b"", properties=Properties(topic_alias=3)), 4) == h("30 03 00 01 61")

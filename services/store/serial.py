"""Compact binary form of `Message` for the Redis queue.

Layout (big-endian):

    version u8 | flags u8 | expires_at_ms u64 | topic_len u16 | sender_len u16
    | payload_len u32 | topic | sender | payload | properties (if flag)

flags: bits 0-1 QoS, bit 2 retain, bit 3 has expiry, bit 4 has properties,
bit 5 has a share group.
The Lua scripts read the QoS (byte 2) and the expiry (bytes 3-10) in place,
so those offsets are part of the scripts' contract. Properties, when any,
are a count u8 then per property its MQTT property id u8 and a value:
int u32; str and bytes u32 length + bytes; int tuple u16 count + u32 each;
user properties u16 count + (str, str) pairs. A share group (`Message.share`)
comes last: u16 length + group, u16 length + filter. It was added without a
version change: a reader that does not know bit 5 ignores the trailing bytes
(and delivers the copy as a plain one), so nodes of both kinds can share a
queue during an upgrade.
"""

from __future__ import annotations

import struct
from dataclasses import fields
from typing import Any

from services.mqtt.packets import NO_PROPERTIES, Message, Properties, PropertyId

VERSION = 1
_HEAD = struct.Struct(">BBQHHI")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_RETAIN, _EXPIRY, _PROPS, _SHARE = 0x04, 0x08, 0x10, 0x20


class SerialError(ValueError):
    """Bytes that are not a serialized message of a known version."""


_INT, _STR, _BYTES, _INTS, _PAIRS = range(5)
_KINDS = {
    "int | None": _INT,
    "str | None": _STR,
    "bytes | None": _BYTES,
    "tuple[int, ...]": _INTS,
    "tuple[tuple[str, str], ...]": _PAIRS,
}
_FIELDS: list[tuple[str, int, int]] = [
    (f.name, PropertyId[f.name.upper()], _KINDS[str(f.type)]) for f in fields(Properties)
]
_BY_ID = {pid: (name, kind) for name, pid, kind in _FIELDS}


def _put_str(out: list[bytes], data: bytes) -> None:
    out.append(_U32.pack(len(data)))
    out.append(data)


def _encode_properties(props: Properties) -> bytes:
    out: list[bytes] = []
    count = 0
    for name, pid, kind in _FIELDS:
        value = getattr(props, name)
        if value is None or value == ():
            continue
        count += 1
        out.append(bytes((pid,)))
        if kind == _INT:
            out.append(_U32.pack(value))
        elif kind == _STR:
            _put_str(out, value.encode())
        elif kind == _BYTES:
            _put_str(out, value)
        elif kind == _INTS:
            out.append(_U16.pack(len(value)))
            out.extend(_U32.pack(v) for v in value)
        else:
            out.append(_U16.pack(len(value)))
            for key, val in value:
                _put_str(out, key.encode())
                _put_str(out, val.encode())
    return bytes((count,)) + b"".join(out)


def dumps(message: Message) -> bytes:
    topic = message.topic.encode()
    sender = message.sender.encode()
    flags = message.qos | (_RETAIN if message.retain else 0)
    if message.expires_at_ms is not None:
        flags |= _EXPIRY
    props = message.properties
    has_props = props is not NO_PROPERTIES and props != NO_PROPERTIES
    if has_props:
        flags |= _PROPS
    share = message.share
    if share is not None:
        flags |= _SHARE
    head = _HEAD.pack(
        VERSION, flags, message.expires_at_ms or 0, len(topic), len(sender), len(message.payload)
    )
    tail = _encode_properties(props) if has_props else b""
    if share is not None:
        group, topic_filter = share[0].encode(), share[1].encode()
        tail += _U16.pack(len(group)) + group + _U16.pack(len(topic_filter)) + topic_filter
    return b"".join((head, topic, sender, message.payload, tail))


def _take_str(data: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += 4
    return data[pos : pos + n], pos + n


def _decode_properties(data: bytes, pos: int) -> tuple[Properties, int]:
    count = data[pos]
    pos += 1
    kwargs: dict[str, Any] = {}
    for _ in range(count):
        name, kind = _BY_ID[data[pos]]
        pos += 1
        value: Any
        if kind == _INT:
            (value,) = _U32.unpack_from(data, pos)
            pos += 4
        elif kind in (_STR, _BYTES):
            raw, pos = _take_str(data, pos)
            value = raw.decode() if kind == _STR else raw
        elif kind == _INTS:
            (n,) = _U16.unpack_from(data, pos)
            value = struct.unpack_from(f">{n}I", data, pos + 2)
            pos += 2 + 4 * n
        else:
            (n,) = _U16.unpack_from(data, pos)
            pos += 2
            pairs = []
            for _ in range(n):
                key, pos = _take_str(data, pos)
                val, pos = _take_str(data, pos)
                pairs.append((key.decode(), val.decode()))
            value = tuple(pairs)
        kwargs[name] = value
    return Properties(**kwargs), pos


def loads(data: bytes) -> Message:
    try:
        version, flags, expires, tlen, slen, plen = _HEAD.unpack_from(data, 0)
        if version != VERSION:
            raise SerialError(f"unknown message serialization version {version}")
        pos = _HEAD.size
        topic = data[pos : pos + tlen].decode()
        pos += tlen
        sender = data[pos : pos + slen].decode()
        pos += slen
        payload = data[pos : pos + plen]
        pos += plen
        props = NO_PROPERTIES
        if flags & _PROPS:
            props, pos = _decode_properties(data, pos)
        share = None
        if flags & _SHARE:
            (glen,) = _U16.unpack_from(data, pos)
            group = data[pos + 2 : pos + 2 + glen].decode()
            pos += 2 + glen
            (flen,) = _U16.unpack_from(data, pos)
            share = (group, data[pos + 2 : pos + 2 + flen].decode())
    except (struct.error, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise SerialError(f"malformed serialized message: {exc}") from exc
    return Message(
        topic,
        payload,
        flags & 0x03,
        bool(flags & _RETAIN),
        props,
        sender,
        expires if flags & _EXPIRY else None,
        share,
    )

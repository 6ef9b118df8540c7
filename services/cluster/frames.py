"""The cluster link's wire format: the HELLO handshake and the frames.

Frames: u32 length (of what follows) | u8 type | body.
  FORWARD  u16 n | n x (u16 len | client id) | message (services.store.serial)
  NOTIFY   u16 n | n x (u16 len | client id)
  KICK     u64 epoch | client id
A frame longer than MAX_FRAME closes the link (the sender is broken).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

from services.cluster.api import LinkError
from services.mqtt.packets import Message
from services.store import serial

PROTOCOL_VERSION = 1
MAGIC = b"WEIRLINK"
FORWARD, NOTIFY, KICK = 1, 2, 3
MAX_FRAME = 256 * 1024 * 1024 + 65536  # the largest MQTT packet, plus targets

_HELLO = struct.Struct(">8sHH")
FRAME = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


class LinkHandler(Protocol):
    """What a node does with frames from its peers (called on the loop)."""

    def on_forward(self, peer: str, message: Message, client_ids: Sequence[str]) -> None: ...

    def on_notify(self, peer: str, client_ids: Sequence[str]) -> None: ...

    def on_kick(self, peer: str, client_id: str, epoch: int) -> None: ...


def hello(node_id: str, version: int = PROTOCOL_VERSION) -> bytes:
    raw = node_id.encode()
    return _HELLO.pack(MAGIC, version, len(raw)) + raw


def parse_hello(data: bytes | bytearray) -> tuple[int, str, int] | None:
    """(version, node id, bytes used), or None for "need more data"."""
    if len(data) < _HELLO.size:
        return None
    magic, version, n = _HELLO.unpack_from(data, 0)
    if magic != MAGIC:
        raise LinkError("not a Weir cluster link")
    end = _HELLO.size + n
    if len(data) < end:
        return None
    return version, bytes(data[_HELLO.size : end]).decode(), end


def _ids(client_ids: Sequence[str]) -> bytes:
    raws = [cid.encode() for cid in client_ids]
    return _U16.pack(len(raws)) + b"".join(_U16.pack(len(raw)) + raw for raw in raws)


def _read_ids(body: bytes, pos: int) -> tuple[list[str], int]:
    (n,) = _U16.unpack_from(body, pos)
    pos += 2
    out = []
    for _ in range(n):
        (k,) = _U16.unpack_from(body, pos)
        pos += 2
        out.append(body[pos : pos + k].decode())
        pos += k
    return out, pos


def _frame(kind: int, body: bytes) -> bytes:
    return FRAME.pack(len(body) + 1, kind) + body


def forward_frame(message: Message, client_ids: Sequence[str]) -> bytes:
    return forward_frame_serialized(serial.dumps(message), client_ids)


def forward_frame_serialized(blob: bytes, client_ids: Sequence[str]) -> bytes:
    """A FORWARD of a message already in `serial.dumps` form (one per fan-out)."""
    return _frame(FORWARD, _ids(client_ids) + blob)


def notify_frame(client_ids: Sequence[str]) -> bytes:
    return _frame(NOTIFY, _ids(client_ids))


def kick_frame(client_id: str, epoch: int) -> bytes:
    return _frame(KICK, _U64.pack(epoch) + client_id.encode())


def dispatch(handler: LinkHandler, peer: str, kind: int, body: bytes) -> None:
    if kind == FORWARD:
        ids, pos = _read_ids(body, 0)
        handler.on_forward(peer, serial.loads(body[pos:]), ids)
    elif kind == NOTIFY:
        ids, _ = _read_ids(body, 0)
        handler.on_notify(peer, ids)
    elif kind == KICK:
        (epoch,) = _U64.unpack_from(body, 0)
        handler.on_kick(peer, body[8:].decode(), epoch)
    else:
        raise LinkError(f"unknown frame type {kind}")

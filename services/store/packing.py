"""Redis commands packed by hiredis's C packer instead of redis-py's Python one.

redis-py's asyncio connection packs every command in Python, argument by
argument (`AbstractConnection.pack_command`): a script call with a batch's
keys and messages as arguments cost 18 µs to pack where `hiredis.pack_command`
takes 4, and packing was 7% of a node's samples with persistent QoS 1
sessions (every PUBLISH and PUBACK is a script call). The bytes are the same
(tests/contract/test_packing.py compares them). redis-py splits a first
argument that holds spaces ("SCRIPT EXISTS") into words; so does this. An
argument hiredis does not take (redis-py raises DataError for a bool, say)
goes to redis-py's packer, which says what is wrong.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)


class _Packed(AbstractConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if isinstance(first, str):
            if " " in first:
                args = (*first.encode().split(), *args[1:])
        elif isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except (TypeError, ValueError, OverflowError):
            return super().pack_command(*args)


class PackedConnection(_Packed, Connection):
    """TCP (redis://)."""


class PackedSSLConnection(_Packed, SSLConnection):
    """TLS (rediss://)."""


class PackedUnixConnection(_Packed, UnixDomainSocketConnection):
    """A Unix socket (unix://)."""


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: PackedConnection,
    SSLConnection: PackedSSLConnection,
    UnixDomainSocketConnection: PackedUnixConnection,
}


def packed(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """The packed kind of `connection_class`; a class not known here stays itself."""
    return _PACKED.get(connection_class, connection_class)

"""The stores' Redis connections pack commands with hiredis: the same bytes
redis-py's Python packer sends, and the same clear error for an argument
neither takes (services/store/packing.py)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from services.store.packing import PackedConnection, PackedUnixConnection
from services.store.redis import connect

COMMANDS: list[tuple[Any, ...]] = [
    ("GET", "k"),
    ("EVALSHA", "a" * 40, 2, b"{c:x}:s", "{c:é}:q", 1, -7, 2**70, 0.1, 1e20, b"\x00\r\n\xff"),
    ("SET", b"big", b"v" * 100_000),  # past redis-py's chunking cutoff
    ("SET", "view", memoryview(b"bytes")),
    ("SCRIPT EXISTS", "a" * 40),  # redis-py splits a first argument's words
    (b"CLIENT SETNAME", b"n"),
    ("HSET", "h", "f", ""),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_hiredis_packs_the_bytes_redis_py_packs(command: tuple[Any, ...]) -> None:
    ours = b"".join(bytes(part) for part in PackedConnection().pack_command(*command))
    redis_py = b"".join(bytes(part) for part in Connection().pack_command(*command))
    assert ours == redis_py


def test_an_argument_neither_takes_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(DataError, match="bool"):
        PackedConnection().pack_command("SET", "k", True)


def test_the_stores_connections_are_packed() -> None:
    assert connect("redis://127.0.0.1:1/0").connection_pool.connection_class is PackedConnection
    unix = connect("unix:///tmp/weir-none.sock").connection_pool.connection_class
    assert unix is PackedUnixConnection
    # the URL's options still win over the defaults, as with from_url
    kwargs = connect("redis://127.0.0.1:1/3?socket_timeout=3").connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["socket_timeout"]) == (3, 3.0)


@pytest.mark.redis
async def test_a_packed_connection_talks_to_redis(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        await client.set("weir-packing", b"\x00\xff" * 1000)
        assert await client.get("weir-packing") == b"\x00\xff" * 1000
        assert await client.execute_command("SCRIPT EXISTS", "0" * 40) == [0]
    finally:
        await client.delete("weir-packing")
        await client.aclose()

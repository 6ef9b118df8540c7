"""Input a connection holds while the node works for it stays bounded.

While a CONNECT is being authenticated (or a session opened, a SUBSCRIBE
logged) the node reads no packet of that client: they stay in its buffer so
that they keep their order. A client pipelining megabytes behind its CONNECT
must meet TCP back-pressure there, not fill the node's memory.

The node runs in a thread here (not a process as in the rest of the suite):
an authenticator that answers only when the test says so makes "while the
node works for it" last as long as the test needs, without a sleep.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from services.auth.api import ALLOW, ClientInfo, Decision
from services.broker.seams import Seams
from services.mqtt.codec import encode
from services.mqtt.packets import Connack, Connect, Pingreq, Pingresp, Publish
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import V311, WAIT_S, Raw, assert_alive

FLOOD = 64 << 20  # bytes pipelined behind the CONNECT
STALL_S = 1.0  # a send that waits this long: the node has stopped reading
HELD_BOUND = FLOOD // 4  # what may be sent before the stall: the kernel's socket
#   buffers on both sides (tcp_rmem/tcp_wmem, a few MB here) and the node's mark


class Gate:
    """An authenticator that lets everyone in, once the test opens the gate."""

    def __init__(self) -> None:
        self.open = asyncio.Event()

    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        await self.open.wait()
        return ALLOW


@pytest.fixture
def gate_node() -> Iterator[tuple[NodeRunner, Gate]]:
    gate = Gate()
    runner = NodeRunner(node_settings(), Seams(authenticator=gate)).start()
    try:
        yield runner, gate
    finally:
        runner.stop()


def send_until_stalled(sock: socket.socket, data: bytes) -> int:
    """Bytes of `data` sent before one send waited STALL_S (or all of it)."""
    sent = 0
    sock.settimeout(STALL_S)
    view = memoryview(data)
    while sent < len(data):
        try:
            sent += sock.send(view[sent : sent + 65536])
        except TimeoutError:
            break
    return sent


def test_pipelined_flood_while_connecting_is_not_buffered(
    gate_node: tuple[NodeRunner, Gate], raws: list[Raw]
) -> None:
    runner, gate = gate_node
    r = Raw(runner.mqtt_port, V311)
    raws.append(r)
    packet = encode(Publish("flood", b"x" * 65000), V311)
    data = encode(Connect("flood", protocol_level=V311, username="u"), V311)
    data += packet * (FLOOD // len(packet)) + encode(Pingreq(), V311)
    started = time.monotonic()
    sent = send_until_stalled(r.sock, data)
    assert sent < HELD_BOUND, f"the node read {sent} bytes of a client it was not serving"
    assert time.monotonic() - started < WAIT_S * 4
    runner.call(gate.open.set)
    r.sock.settimeout(WAIT_S)
    r.sock.sendall(data[sent:])  # the node reads again: the rest goes through
    assert isinstance(r.recv(), Connack)
    assert isinstance(r.recv(), Pingresp)
    assert_alive(raws, runner, V311)

"""Per-listener CIDR rules (refused at accept, before any MQTT byte is read)
and per-listener connection limits."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable

import pytest

from services.mqtt import codec
from services.mqtt.packets import Connect
from tests.integration.conftest import NodeRunner, Paho
from tests.listeners.conftest import Pki, listener, port, tls_table, wait_for

Start = Callable[..., NodeRunner]
CONNECT = codec.encode(Connect(client_id="screened", protocol_level=4), 4)


def refused_at_accept(port_no: int, host: str = "127.0.0.1") -> bool:
    """Connect and send a CONNECT: True if the node closed the socket without a byte."""
    with socket.create_connection((host, port_no), timeout=5) as sock:
        try:
            sock.sendall(CONNECT)
            return sock.recv(16) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True


def test_deny_of_127_0_0_1_refuses_before_any_byte_is_read(
    listener_node: Start, clients: list[Paho], caplog: pytest.LogCaptureFixture
) -> None:
    node = listener_node({"name": "closed", "type": "tcp", "port": 0, "deny": ["127.0.0.0/8"]})
    closed = listener(node, "closed")
    caplog.set_level(logging.WARNING, logger="weir.listeners")
    for _ in range(3):
        assert refused_at_accept(port(node, "closed"))
    wait_for(node, lambda: closed.refused["address"] == 3, "three refusals")
    assert node.call(lambda: len(node.node.broker.connections)) == 0  # no Connection was made
    lines = [r.getMessage() for r in caplog.records if r.name == "weir.listeners"]
    assert len(lines) == 1 and "refused 127.0.0.1" in lines[0], lines  # once per minute
    # the default listener of the same node still serves
    ok = Paho(node.mqtt_port, "default-ok")
    clients.append(ok)
    assert ok.connack()[1] == 0


@pytest.mark.parametrize(
    ("allow", "deny", "admitted"),
    [
        (["10.0.0.0/8"], [], False),  # an allow list that does not name the peer
        (["127.0.0.0/8", "::1"], [], True),
        (["127.0.0.0/8"], ["127.0.0.1/32"], False),  # deny wins
        ([], ["10.0.0.0/8"], True),
    ],
)
def test_allow_and_deny(
    listener_node: Start, allow: list[str], deny: list[str], admitted: bool
) -> None:
    node = listener_node({"name": "cidr", "type": "tcp", "port": 0, "allow": allow, "deny": deny})
    if admitted:
        with socket.create_connection(("127.0.0.1", port(node, "cidr")), timeout=5) as sock:
            sock.sendall(CONNECT)
            assert sock.recv(4)[:1] == b"\x20"  # CONNACK
    else:
        assert refused_at_accept(port(node, "cidr"))
        wait_for(node, lambda: listener(node, "cidr").refused["address"] == 1, "the refusal")


def test_a_denied_peer_gets_no_tls_handshake(listener_node: Start, pki: Pki) -> None:
    node = listener_node(tls_table(pki, "tls", deny=["127.0.0.1"]))
    with (
        socket.create_connection(("127.0.0.1", port(node, "tls")), timeout=5) as raw,
        pytest.raises((ssl.SSLError, ConnectionResetError, OSError)),
    ):
        pki.client().wrap_socket(raw, server_hostname="127.0.0.1")
    tls = listener(node, "tls")
    wait_for(node, lambda: tls.refused["address"] == 1, "the refusal")
    assert tls.refused["tls"] == 0  # refused before the handshake, not by it


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_max_connections_per_listener(listener_node: Start, clients: list[Paho], v5: bool) -> None:
    node = listener_node({"name": "small", "type": "tcp", "port": 0, "max_connections": 1})
    small = port(node, "small")
    first = Paho(small, "first", v5=v5)
    clients.append(first)
    assert first.connack()[1] == 0
    second = Paho(small, "second", v5=v5)
    clients.append(second)
    # 5.0: quota exceeded; 3.1.1: return code 3, server unavailable (paho says it by name)
    assert str(second.connack()[1]) == ("Quota exceeded" if v5 else "Server unavailable")
    assert listener(node, "small").refused["full"] == 1
    other = Paho(node.mqtt_port, "elsewhere", v5=v5)  # the node's other listener is not full
    clients.append(other)
    assert other.connack()[1] == 0
    first.close()
    wait_for(node, lambda: listener(node, "small").connections == 0, "the slot to free")
    third = Paho(small, "third", v5=v5)
    clients.append(third)
    assert third.connack()[1] == 0


def test_ipv6_peers_are_screened_too(listener_node: Start) -> None:
    node = listener_node(
        {"name": "v6", "type": "tcp", "host": "::1", "port": 0, "deny": ["::1/128"]},
        {"name": "v6ok", "type": "tcp", "host": "::1", "port": 0, "allow": ["::1"]},
    )
    assert refused_at_accept(port(node, "v6"), "::1")
    wait_for(node, lambda: listener(node, "v6").refused["address"] == 1, "the refusal")
    with socket.create_connection(("::1", port(node, "v6ok")), timeout=5) as sock:
        sock.sendall(CONNECT)
        assert sock.recv(4)[:1] == b"\x20"  # CONNACK

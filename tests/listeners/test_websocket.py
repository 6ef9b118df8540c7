"""WebSocket and secure WebSocket listeners with paho's websockets transport,
several listeners on one node at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration.conftest import NodeRunner, Paho
from tests.listeners.conftest import Pki, clients_on, port, tls_table

Start = Callable[..., NodeRunner]


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_ws_and_wss_round_trip_and_cross_listeners(
    listener_node: Start, pki: Pki, clients: list[Paho], v5: bool
) -> None:
    node = listener_node(
        tls_table(pki, "wss", kind="wss"),
        tls_table(pki, "tls"),
        {"name": "ws2", "type": "ws", "port": 0},
    )
    wss = Paho(port(node, "wss"), "over-wss", v5=v5, transport="websockets", tls=pki.client())
    ws = Paho(node.ws_port, "over-ws", v5=v5, transport="websockets")
    ws2 = Paho(port(node, "ws2"), "over-ws2", v5=v5, transport="websockets")
    tls = Paho(port(node, "tls"), "over-tls", v5=v5, tls=pki.client())
    plain = Paho(node.mqtt_port, "over-tcp", v5=v5)
    everyone = [wss, ws, ws2, tls, plain]
    clients += everyone
    assert [c.connack()[1] for c in everyone] == [0] * 5
    seen = clients_on(node)
    assert {cid: seen[cid].listener for cid in seen} == {
        "over-wss": "wss",
        "over-ws": "ws",
        "over-ws2": "ws2",
        "over-tls": "tls",
        "over-tcp": "mqtt",
    }
    for c in everyone:
        c.subscribe("all/#", qos=1)
    for c in everyone:  # each publishes once; everyone gets all five, whatever the listener
        c.publish(f"all/{c.client._client_id.decode()}", b"hi", qos=1)
    for c in everyone:
        got = sorted(c.message().topic for _ in everyone)
        assert got == sorted(f"all/{x}" for x in seen)


def test_wss_client_certificate_names_the_user(
    listener_node: Start, pki: Pki, clients: list[Paho]
) -> None:
    node = listener_node(
        tls_table(pki, "wss", kind="wss", cafile=pki.cafile, verify="required", cert_username="cn")
    )
    c = Paho(
        port(node, "wss"), "ws-device", v5=True, transport="websockets", tls=pki.client("sensor-7")
    )
    clients.append(c)
    assert c.connack()[1] == 0
    info = clients_on(node)["ws-device"]
    assert info.username == "sensor-7" and info.listener == "wss"

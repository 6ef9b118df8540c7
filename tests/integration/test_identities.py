"""The seams' identities (who each client was, for its will's ACL check) stay
bounded by the clients that may still need them (services.broker.seams)."""

from __future__ import annotations

from tests.integration.conftest import NodeRunner, Paho


def test_a_connection_without_a_will_leaves_no_identity_behind(node: NodeRunner) -> None:
    """The seams keep who each client was for its will's ACL check; clients
    without a will leave nothing (every client id ever seen was kept)."""
    seams = node.node.services.seams
    for i in range(20):
        c = Paho(node.mqtt_port, f"passing-{i}")
        assert c.connack()[1] == 0
        c.close()
    willing = Paho(node.mqtt_port, "willing", will=("w/gone", b"bye", 1))
    assert willing.connack()[1] == 0
    watcher = Paho(node.mqtt_port, "watcher")
    assert watcher.connack()[1] == 0
    watcher.subscribe("w/#", qos=1)
    willing.drop()  # no DISCONNECT: its will goes out, checked as it connected
    m = watcher.message(timeout=10.0)
    assert (m.topic, m.payload) == ("w/gone", b"bye")
    kept = node.call(lambda: set(seams._identities))
    assert not any(k.startswith("passing-") for k in kept)
    assert "willing" in kept and "watcher" in kept  # connected, or ended with a will
    watcher.close()

"""What a node keeps of connections that are gone: the seams' identities (who
each client was, for its will's ACL check) only while a will may need them
(services.broker.seams); nothing in the timer wheel (services.broker.timers)."""

from __future__ import annotations

from tests.integration.conftest import NodeRunner, Paho
from tests.support.wait import wait_until


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


def test_a_closed_connection_leaves_the_timer_wheel_at_once(node: NodeRunner) -> None:
    """The wheel held each closed connection, whole, until its keep alive's
    deadline (1.5 x 30 s here): at a few hundred lives a second, tens of
    thousands of dead connections."""
    wheel = node.node.broker.wheel
    for i in range(20):
        c = Paho(node.mqtt_port, f"brief-{i}")
        assert c.connack()[1] == 0
        c.close()
    staying = Paho(node.mqtt_port, "staying")
    assert staying.connack()[1] == 0
    wait_until(lambda: node.call(lambda: len(wheel)) == 1, "only the open connection's timers")
    staying.close()
    wait_until(lambda: node.call(lambda: len(wheel)) == 0, "no timers")

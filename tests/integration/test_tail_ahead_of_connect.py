"""A publish while the log's tail is ahead of a CONNECT still reaches the queue.

A node logs a resumed session's SessionOpened before its CONNACK and puts the
session in its routing table once the append returns. Its own tail reads the
same log and can apply that event first: the view then says the client is
online on this node while the table has no session for it. A publish in that
window (a publisher that moved to this node with its subscribers, as in the
partition suite's clients <-> node cut) was routed to nobody and still
acknowledged: an acknowledged message lost. Here the tail's early copy is
applied by hand, between a takeover elsewhere and the client's CONNECT here.
"""

from __future__ import annotations

import time

from services.event.schema import SessionOpened
from services.mqtt.packets import Properties, Puback, Publish, Subscription
from tests.integration.conftest import NodeRunner
from tests.integration.rawclient import V5, Raw, opened, v5_disconnect_code

EXPIRY_S = 600
PERSISTENT = {"clean_start": False, "properties": Properties(session_expiry_interval=EXPIRY_S)}
LATE = 1 << 60  # versions above any the node's store hands out


def opened_on(node: NodeRunner, owner: str, client_id: str, version: int) -> None:
    """Apply a SessionOpened as the log's tail brings it."""
    event = SessionOpened(
        client_id=client_id, version=version, node=owner, ts_ms=int(time.time() * 1000),
        epoch=version, clean_start=False, expiry_s=EXPIRY_S, protocol=5,
    )  # fmt: skip
    node.call(lambda: node.node.broker.logstate.apply(event))


def test_publish_between_the_tail_and_the_connect_reaches_the_session(
    node: NodeRunner, raws: list[Raw]
) -> None:
    sub = opened(raws, node, "tail-sub", V5, **PERSISTENT)
    assert sub.subscribe(Subscription("tail/#", 1)).reason_codes == (1,)
    # Another node takes the session over (the log says so): ours goes.
    opened_on(node, "node-other", "tail-sub", LATE)
    assert v5_disconnect_code(sub.closed()) == 0x8E
    # The client comes back here; the tail applies this CONNECT's SessionOpened
    # before the CONNECT gets its session into the table, and a publish comes.
    opened_on(node, node.node.settings.node_id, "tail-sub", LATE + 1)
    pub = opened(raws, node, "tail-pub")  # 3.1.1, as the suite's: a plain PUBACK
    pub.send(Publish("tail/x", b"in the window", qos=1, packet_id=1))
    pub.expect(Puback)  # acknowledged: it must be kept
    back = opened(raws, node, "tail-sub", V5, **PERSISTENT)
    got = back.expect(Publish)
    assert got.payload == b"in the window"

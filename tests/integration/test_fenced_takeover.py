"""A store call that meets a newer owner's epoch ends the connection as a takeover.

When a client's session is claimed on another node, that node kicks the old
one over the cluster link; but the old connection's own store call can meet
the new epoch (`Fenced`) before the kick arrives. The connection must then
end exactly as the kick would have ended it: DISCONNECT 0x8E (session taken
over) on 5.0, not a bare close (which a 5.0 client reads as a network error).
Here "another node" is a claim made straight in the node's session store
under another node id: no kick ever comes, so the store call always wins.
"""

from __future__ import annotations

import asyncio

from services.mqtt.packets import Properties, Puback, Publish, Subscription
from tests.integration.conftest import NodeRunner
from tests.integration.rawclient import V5, Raw, opened, v5_disconnect_code

SESSION_TAKEN_OVER = 0x8E
PERSISTENT = {"clean_start": False, "properties": Properties(session_expiry_interval=60)}


def claim_elsewhere(node: NodeRunner, client_id: str) -> None:
    """Another node claims the session (a newer epoch) and tells nobody."""
    assert node.loop is not None
    store = node.node.services.sessions
    claim = store.claim(client_id, "node-elsewhere", False, 60)
    asyncio.run_coroutine_threadsafe(claim, node.loop).result(5.0)


def test_qos2_publish_of_a_session_claimed_elsewhere_gets_0x8e(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """Dispatch's incoming QoS 2 check is the store call that meets the epoch."""
    pub = opened(raws, node, "fenced-pub", V5, **PERSISTENT)
    claim_elsewhere(node, "fenced-pub")
    pub.send(Publish("fenced/x", b"1", qos=2, packet_id=1))
    assert v5_disconnect_code(pub.closed()) == SESSION_TAKEN_OVER


def test_puback_of_a_session_claimed_elsewhere_gets_0x8e(
    node: NodeRunner, raws: list[Raw]
) -> None:
    """Delivery's pump (the PUBACK's ack and the next take) meets the epoch."""
    sub = opened(raws, node, "fenced-sub", V5, **PERSISTENT)
    assert sub.subscribe(Subscription("fenced/y", 1)).reason_codes == (1,)
    pub = opened(raws, node, "fenced-sender", V5)
    pub.send(Publish("fenced/y", b"2", qos=1, packet_id=1))
    assert pub.expect(Puback).reason_code == 0
    got = sub.expect(Publish)
    claim_elsewhere(node, "fenced-sub")
    sub.send(Puback(got.packet_id))
    assert v5_disconnect_code(sub.closed()) == SESSION_TAKEN_OVER

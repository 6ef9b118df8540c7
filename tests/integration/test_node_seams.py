"""The node's seams over real sockets: an authenticator refuses CONNECTs, an
authorizer denies topics, a message.publish hook rewrites a message, and the
metrics recorder counts connections and sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from services.auth.api import ALLOW, Action, ClientInfo, Decision
from services.broker.seams import Seams
from services.hooks.api import HOOK_POINTS, Continue, Hooks
from services.metrics.registry import Metrics
from services.mqtt.packets import (
    Connect,
    Message,
    Properties,
    Puback,
    Publish,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import V5, V311, Raw, opened, v5_disconnect_code


class PasswordCheck:
    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        await asyncio.sleep(0)  # a real backend awaits something
        return ALLOW if password == b"secret" else Decision(False, 0x86)


class NoSecrets:
    def allowed(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):
        return not topic.startswith("secret/")


QUEUE_LIMIT = 2


class SeamsNode(NodeRunner):
    def __init__(self, seams: Seams) -> None:
        super().__init__(node_settings(queue_limit=QUEUE_LIMIT))
        self.seams = seams

    async def _main(self) -> None:
        from services.node.app import build_services
        from services.node.node import Node

        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        services = replace(build_services(self.settings), seams=self.seams)
        self.node = Node(self.settings, services)
        await self.node.start()
        self._ready.set()
        await self._stop.wait()
        await self.node.stop()


def _shout(client: ClientInfo | None, message: Message) -> Continue:
    return Continue(replace(message, payload=message.payload.upper()))


@pytest.fixture
def seams() -> Seams:
    hooks = Hooks()
    hooks.add("message.publish", _shout)
    return Seams(PasswordCheck(), NoSecrets(), hooks, Metrics())


@pytest.fixture
def node(seams: Seams) -> Iterator[NodeRunner]:
    runner = SeamsNode(seams).start()
    try:
        yield runner
    finally:
        runner.stop()


@pytest.mark.parametrize(("level", "code"), [(V5, 0x86), (V311, 4)])
def test_authenticator_refuses_a_bad_password(
    node: NodeRunner, raws: list[Raw], level: int, code: int
) -> None:
    bad = Raw(node.mqtt_port, level)
    raws.append(bad)
    bad.send(Connect("intruder", protocol_level=level, username="u", password=b"guess"))
    assert [p.reason_code for p in bad.closed()] == [code]


def test_authorizer_hooks_and_metrics(node: NodeRunner, raws: list[Raw], seams: Seams) -> None:
    login = {"username": "u", "password": b"secret"}
    sub = opened(raws, node, "s-sub", V5, **login)
    ack = sub.subscribe(Subscription("secret/#", 1), Subscription("open/#", 1))
    assert ack.reason_codes == (0x87, 1)
    pub = opened(raws, node, "s-pub", V5, **login)
    pub.send(Publish("secret/x", b"no", qos=1, packet_id=1))
    assert pub.expect(Puback).reason_code == 0x87
    pub.send(Publish("open/x", b"quiet", qos=1, packet_id=2))
    assert pub.expect(Puback).reason_code == 0
    assert sub.expect(Publish).payload == b"QUIET"  # the hook rewrote it
    metrics = seams.metrics
    assert metrics.connections_accepted == 2
    assert metrics.sessions_created == 2
    assert metrics.authentication_success == 2


def test_refused_messages_are_counted(node: NodeRunner, raws: list[Raw], seams: Seams) -> None:
    login = {"username": "u", "password": b"secret"}
    persistent = {"clean_start": False, "properties": Properties(session_expiry_interval=60)}
    sub = opened(raws, node, "s-away", V5, **login, **persistent)
    assert sub.subscribe(Subscription("away/#", 1)).reason_codes == (1,)
    sub.close()
    pub = opened(raws, node, "s-pub2", V5, **login)
    codes = []
    for i in range(1, QUEUE_LIMIT + 2):
        pub.send(Publish("away/x", b"%d" % i, qos=1, packet_id=i))
        codes.append(pub.expect(Puback).reason_code)
    assert codes == [0] * QUEUE_LIMIT + [0x97]
    metrics = seams.metrics
    assert metrics.messages_refused == 1
    assert metrics.full_queues == {"s-away"}


def test_hook_points_fire_where_the_node_reaches_them(raws: list[Raw]) -> None:
    hooks, seen = Hooks(), []
    for point in HOOK_POINTS:
        hooks.add(point, lambda *args, point=point: seen.append(point))
    hooks.add("client.check_acl", lambda client, action, topic, ok: Continue(topic != "h/deny"))
    runner = SeamsNode(Seams(PasswordCheck(), hooks=hooks)).start()
    try:
        login = {"username": "u", "password": b"secret"}
        persistent = {"clean_start": False, "properties": Properties(session_expiry_interval=60)}
        sub = opened(raws, runner, "h-sub", V5, **login, **persistent)
        assert sub.subscribe(Subscription("h/#", 1)).reason_codes == (1,)
        pub = opened(raws, runner, "h-pub", V5, **login)
        pub.send(Publish("h/deny", b"x", qos=1, packet_id=1))
        assert pub.expect(Puback).reason_code == 0x87  # the check_acl hook said no
        pub.send(Publish("h/x", b"y", qos=1, packet_id=2))
        assert pub.expect(Puback).reason_code == 0
        got = sub.expect(Publish)
        sub.send(Puback(got.packet_id))
        sub.send(Unsubscribe(2, ("h/#",)))
        sub.expect(Unsuback)
        again = opened(raws, runner, "h-sub", V5, **login, **persistent)  # takes it over
        assert v5_disconnect_code(sub.closed()) == 0x8E
        opened(raws, runner, "h-sub", V5, **login)  # Clean Start 1: discards it
        assert v5_disconnect_code(again.closed()) == 0x8E
        pub.send(Publish("h/x", b"barrier", qos=1, packet_id=3))
        pub.expect(Puback)
    finally:
        runner.stop()
    assert set(HOOK_POINTS) - set(seen) == set()

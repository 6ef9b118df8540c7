"""Issue 11's limits on a live node (memory backends, real sockets), with real
paho 3.1.1 and 5.0 clients: connection rates, per-client message and byte rates
(reading pauses, nothing is lost), subscriptions per client, bans by client id,
user name and address with expiry and disconnect-on-add, flapping, and the
counters and log lines of every refusal."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.auth.api import ALLOW, ClientInfo, Decision
from services.auth.banned import Ban
from services.broker.seams import Seams, admitting
from services.metrics.registry import Metrics
from tests.integration.conftest import NodeRunner, Paho, node_settings

LEVELS = [pytest.param(False, id="v311"), pytest.param(True, id="v5")]


class Limited:
    """A node with these limits and a counting recorder."""

    def __init__(self, authenticator: Any = None, **limits: Any) -> None:
        settings = node_settings(**limits)
        self.metrics = Metrics()
        seams = Seams(metrics=self.metrics)
        if authenticator is not None:
            seams = Seams(authenticator=authenticator, metrics=self.metrics)
        seams = admitting(seams, settings.limits)
        self.runner = NodeRunner(settings, seams).start()
        self.port = self.runner.mqtt_port
        self.clients: list[Paho] = []

    def client(self, client_id: str, v5: bool, **kw: Any) -> Paho:
        c = Paho(self.port, client_id, v5=v5, **kw)
        self.clients.append(c)
        return c

    def connack(self, client_id: str, v5: bool, **kw: Any) -> str:
        """The name paho gives the CONNACK's code (3.1.1 codes as their 5.0 names);
        the client is closed then (paho would reconnect a refused one)."""
        c = Paho(self.port, client_id, v5=v5, **kw)
        try:
            return str(c.connack()[1].getName())
        finally:
            c.close()

    def ban(self, ban: Ban) -> None:
        admission = self.runner.node.services.seams.admission
        assert self.runner.loop is not None
        asyncio.run_coroutine_threadsafe(admission.bans.add(ban), self.runner.loop).result(5)

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        self.runner.stop()


@pytest.fixture
def limited() -> Iterator[list[Limited]]:
    made: list[Limited] = []
    yield made
    for node in made:
        node.stop()


def start(made: list[Limited], authenticator: Any = None, **limits: Any) -> Limited:
    node = Limited(authenticator, **limits)
    made.append(node)
    return node


RATE_EXCEEDED = {False: "Server unavailable", True: "Connection rate exceeded"}
BANNED = {False: "Not authorized", True: "Banned"}


@pytest.mark.parametrize("v5", LEVELS)
@pytest.mark.parametrize(("option", "n"), [("max_conn_rate", 3), ("max_conn_rate_per_ip", 2)])
def test_connection_rate(limited: list[Limited], v5: bool, option: str, n: int) -> None:
    """n CONNECTs a minute on the listener (or from one address): n connect,
    the next gets 0x9F (3.1.1: 3)."""
    node = start(limited, **{option: f"{n}/minute"})
    assert [node.connack(f"c{i}", v5) for i in range(n)] == ["Success"] * n
    assert node.connack("over", v5) == RATE_EXCEEDED[v5]
    assert node.metrics.connections_refused["rate_limited"] == 1


def publish_all(pub: Paho, n: int, size: int = 8) -> list[bytes]:
    """Publish n QoS 1 messages without waiting for each; their payloads."""
    payloads = [b"%06d" % i + b"x" * (size - 6) for i in range(n)]
    infos = [pub.client.publish("rate/t", p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(timeout=10.0)
    return payloads


def received(sub: Paho, n: int) -> list[bytes]:
    return [sub.message(timeout=10.0).payload for _ in range(n)]


@pytest.mark.parametrize("v5", LEVELS)
def test_a_client_over_its_message_rate_is_slowed_and_loses_nothing(
    limited: list[Limited], v5: bool
) -> None:
    """20 PUBLISHes a second: 20 go through unpaused; 50 take at least two more
    windows (reading paused twice or more) and all 50 arrive, in order."""
    node = start(limited, client_msg_rate="20/second")
    sub = node.client("sub", v5)
    assert sub.connack()[1].getName() == "Success"
    sub.subscribe("rate/t", 1)
    pub = node.client("pub", v5)
    pub.connack()
    under = publish_all(pub, 20)
    assert received(sub, 20) == under
    assert node.metrics.connections_read_paused == 0
    began = time.monotonic()
    sent = publish_all(pub, 50)
    assert received(sub, 50) == sent
    elapsed = time.monotonic() - began
    assert node.metrics.connections_read_paused >= 2
    assert elapsed >= 1.9, elapsed  # two whole windows at least (20 + 20 + 10)


@pytest.mark.parametrize("v5", LEVELS)
def test_a_client_over_its_byte_rate_is_slowed_and_loses_nothing(
    limited: list[Limited], v5: bool
) -> None:
    node = start(limited, client_byte_rate="25000/second")
    sub = node.client("sub", v5)
    sub.connack()
    sub.subscribe("rate/t", 1)
    pub = node.client("pub", v5)
    pub.connack()
    under = publish_all(pub, 2, size=10_000)  # 20 KB of the 25 KB
    assert received(sub, 2) == under
    assert node.metrics.connections_read_paused == 0
    began = time.monotonic()
    sent = publish_all(pub, 6, size=10_000)  # two packets fit a window: three windows
    assert received(sub, 6) == sent
    assert node.metrics.connections_read_paused >= 2
    assert time.monotonic() - began >= 1.9


@pytest.mark.parametrize("v5", LEVELS)
def test_max_subscriptions_per_client(limited: list[Limited], v5: bool) -> None:
    """Two filters: a third gets 0x97 (3.1.1: 0x80); a filter held already is
    granted again; in one SUBSCRIBE the new one over is refused, the held one not."""
    node = start(limited, max_subscriptions=2)
    c = node.client("c", v5)
    c.connack()
    assert [rc.value for rc in c.subscribe("a", 1)] == [1]
    assert [rc.value for rc in c.subscribe("b", 0)] == [0]
    over = 0x97 if v5 else 0x80
    assert [rc.value for rc in c.subscribe("c", 1)] == [over]
    assert [rc.value for rc in c.subscribe("a", 0)] == [0]
    c.client.subscribe([("d", 1), ("b", 1)])
    assert [rc.value for rc in c.subacks.get(timeout=5)] == [over, 1]
    assert node.metrics.subscriptions_quota_exceeded == 2


@pytest.mark.parametrize("v5", LEVELS)
def test_bans_by_client_id_user_name_and_address(limited: list[Limited], v5: bool) -> None:
    node = start(limited)
    now = time.time()
    node.ban(Ban("clientid", "evil", now + 600))
    node.ban(Ban("username", "mallory", None))
    assert node.connack("evil", v5) == BANNED[v5]
    assert node.connack("c1", v5, username="mallory", password="x") == BANNED[v5]
    assert node.connack("c2", v5, username="alice", password="x") == "Success"
    node.ban(Ban("peerhost", "127.0.0.0/8", now + 600))
    assert node.connack("c3", v5) == BANNED[v5]
    assert node.metrics.connections_refused["banned"] == 3


def test_a_ban_ends_at_its_expiry(limited: list[Limited]) -> None:
    node = start(limited)
    node.ban(Ban("clientid", "brief", time.time() + 1.0))
    assert node.connack("brief", True) == BANNED[True]
    deadline = time.monotonic() + 10.0
    while (answer := node.connack("brief", True)) != "Success":
        assert answer == BANNED[True] and time.monotonic() < deadline


@pytest.mark.parametrize("v5", LEVELS)
def test_adding_a_ban_disconnects_the_clients_it_covers(limited: list[Limited], v5: bool) -> None:
    node = start(limited)
    target, bystander = node.client("target", v5), node.client("bystander", v5)
    target.connack(), bystander.connack()
    node.ban(Ban("clientid", "target"))
    rc = target.disconnects.get(timeout=5.0)
    if v5:  # 3.1.1 has no DISCONNECT from the server: the socket closes
        assert rc.value == 0x98, rc
    bystander.subscribe("still/here", 0)
    bystander.publish("still/here", b"x")
    assert bystander.message().payload == b"x"
    assert node.metrics.connections_kicked_banned == 1


def test_flapping_bans_the_client_id_and_logs_once(
    limited: list[Limited], caplog: pytest.LogCaptureFixture
) -> None:
    """3 connects a minute allowed: the 4th is refused as banned (flapping, one
    log line), the 5th by the ban itself; another client id is not touched."""
    node = start(limited, flapping=True, flapping_max_connects=3, flapping_ban_s=60.0)
    caplog.set_level(logging.WARNING, logger="weir.auth")
    for _ in range(3):
        c = node.client("flappy", True)
        assert c.connack()[1].getName() == "Success"
        c.close()
    assert node.connack("flappy", True) == "Banned"
    assert node.connack("flappy", False) == "Not authorized"
    assert node.connack("steady", True) == "Success"
    assert node.metrics.connections_refused["flapping"] == 1
    assert node.metrics.connections_refused["banned"] == 1
    flapping = [r for r in caplog.records if r.getMessage().startswith("flapping:")]
    assert len(flapping) == 1 and "flappy" in flapping[0].getMessage()
    refused = [r for r in caplog.records if r.getMessage().startswith("connect refused")]
    assert len(refused) == 2
    assert all("client flappy" in r.getMessage() and "peer 127.0.0.1" in r.getMessage()
               for r in refused)  # fmt: skip


def test_flapping_by_address(limited: list[Limited]) -> None:
    node = start(limited, flapping=True, flapping_max_connects_ip=2, flapping_ban_s=60.0)
    assert [node.connack(f"a{i}", True) for i in range(2)] == ["Success"] * 2
    assert node.connack("a2", True) == "Banned"
    bans = node.runner.node.services.seams.admission.bans.bans()
    assert [(b.kind, b.who, b.by) for b in bans] == [("peerhost", "127.0.0.1/32", "flapping")]


def test_without_limits_nothing_is_counted_or_budgeted(limited: list[Limited]) -> None:
    node = start(limited)
    c = node.client("free", True)
    c.connack()
    conns = node.runner.call(lambda: list(node.runner.node.broker.connections))
    assert [conn.budget for conn in conns] == [None]
    refused = node.metrics.connections_refused
    assert refused["rate_limited"] == refused["banned"] == 0


def test_a_client_waiting_for_its_rate_is_not_timed_out_for_keep_alive(
    limited: list[Limited],
) -> None:
    """Keep alive 1 s (1.5 s without a packet read ends a connection); 2 PUBLISHes
    per 3 s: the 5 PUBLISHes wait two windows, unread for longer than that, and
    the connection stays: every PUBACK comes, then a PINGRESP."""
    from services.mqtt.packets import Pingreq, Pingresp, Puback, Publish
    from tests.integration.rawclient import V5, Raw

    node = start(limited, client_msg_rate="2 per 3 seconds")
    raw = Raw(node.port, V5)
    try:
        assert raw.connect("ka", keep_alive=1).reason_code == 0
        began = time.monotonic()
        for packet_id in range(1, 6):
            raw.send(Publish("ka/t", b"x", qos=1, packet_id=packet_id))
        raw.send(Pingreq())
        answers = [raw.recv(10.0) for _ in range(6)]  # the PINGRESP may pass a PUBACK
        assert [p.packet_id for p in answers if isinstance(p, Puback)] == [1, 2, 3, 4, 5]
        assert sum(isinstance(p, Pingresp) for p in answers) == 1
        assert time.monotonic() - began >= 3.0  # at least one whole window unread
    finally:
        raw.close()


@pytest.mark.parametrize("v5", LEVELS)
def test_max_inflight_holds_the_rest_until_an_ack(limited: list[Limited], v5: bool) -> None:
    """Two unacknowledged QoS 1 messages out at most: of five routed, two come;
    a PINGREQ then is answered before any third; each PUBACK lets one more go."""
    from services.mqtt.packets import Pingreq, Pingresp, Puback, Publish, Subscription
    from tests.integration.rawclient import V5, V311, Raw

    node = start(limited, max_inflight=2)
    raw = Raw(node.port, V5 if v5 else V311)
    try:
        raw.connect("slow")
        raw.subscribe(Subscription("inflight/t", qos=1))
        pub = node.client("pub", v5)
        pub.connack()
        for i in range(5):
            pub.publish("inflight/t", b"%d" % i, qos=1)  # each PUBACKed: routed
        first = [raw.expect(Publish) for _ in range(2)]
        raw.send(Pingreq())
        assert isinstance(raw.recv(), Pingresp)  # no third before it
        got = [p.payload for p in first]
        for p in first:
            raw.send(Puback(p.packet_id))
            got.append(raw.expect(Publish).payload)
        assert got == [b"0", b"1", b"2", b"3"]
    finally:
        raw.close()


def test_max_inflight_caps_the_window_negotiated() -> None:
    from services.mqtt.channel_config import ChannelConfig
    from services.mqtt.channel_connect import Negotiated, negotiate
    from services.mqtt.packets import Connect, Properties

    def window(config: ChannelConfig, level: int, receive_maximum: int | None) -> int:
        props = Properties(receive_maximum=receive_maximum)
        neg = negotiate(config, Connect("c", level, properties=props), lambda: "x")
        assert isinstance(neg, Negotiated)
        return neg.client_receive_maximum

    capped = ChannelConfig(max_inflight=2)
    assert [window(capped, 5, 10), window(capped, 5, 1), window(capped, 4, None)] == [2, 1, 2]
    assert [window(ChannelConfig(), 5, None), window(ChannelConfig(), 4, None)] == [65535, 32]


class Counting:
    """An authenticator that lets everyone in and counts who it was asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        self.asked.append(client.client_id)
        return ALLOW


@pytest.mark.parametrize("v5", LEVELS)
def test_a_banned_client_is_refused_before_the_authenticator_is_asked(
    limited: list[Limited], v5: bool
) -> None:
    counting = Counting()
    node = start(limited, counting)
    node.ban(Ban("clientid", "evil"))
    assert node.connack("evil", v5, username="u", password="p") == BANNED[v5]
    assert node.connack("good", v5, username="u", password="p") == "Success"
    assert counting.asked == ["good"]

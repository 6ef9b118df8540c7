"""Shared subscriptions across nodes: each message to one live member anywhere.

Two or three nodes (tests/support/backend_node.py: each in its own thread and
event loop, with its own cluster link and membership) on one Redis and one
Kafka. Subscriptions and sessions reach the other nodes through the log, so
each test first waits until the publishing node sees the group as it needs
it (members, where they are online, the link to their node). Exactly once
is checked by counting, then by a barrier per member: a plain subscription
of that member only, published to after everything else on the same path.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import time
import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.mqtt.packets import Properties, Puback, Publish, Subscription
from tests.integration.conftest import Paho
from tests.integration.rawclient import LEVELS, V5, Raw, opened
from tests.integration.test_cluster_nodes import NodeProc
from tests.support.backend_node import BackendNode, backend_settings, start_node
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

PROPAGATION_S = 20.0  # the log's tail and a membership poll, on a busy machine
COLLECT_S = 10.0
PAUSE_MS = 1000  # Redis writes paused: well within a store call's bound (2 s): none fails
GROUP = ("g", "job/#")
SHARED = "$share/g/job/#"


class Cluster:
    def __init__(self, redis_url: str, bootstrap: str, prefix: str) -> None:
        self.redis_url, self.bootstrap, self.prefix = redis_url, bootstrap, prefix
        self.nodes: dict[str, BackendNode] = {}

    def start(self, node_id: str, **settings: Any) -> BackendNode:
        base = backend_settings(self.redis_url, self.bootstrap, self.prefix, node_id)
        runner = start_node(replace(base, **settings))
        self.nodes[node_id] = runner
        return runner

    def linked(self) -> None:
        """Until every node has a link up to every other one."""
        for node_id, runner in self.nodes.items():
            router = runner.node.services.cluster
            for peer in self.nodes:
                if peer != node_id:
                    linked = functools.partial(router.links.is_connected, peer)
                    wait_until(linked, f"{node_id} linked to {peer}", PROPAGATION_S)

    def stop(self) -> None:
        for runner in self.nodes.values():
            runner.stop()


@pytest.fixture
def cluster(redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str) -> Iterator[Cluster]:
    c = Cluster(redis_url, kafka_bootstrap, kafka_topic_prefix)
    try:
        yield c
    finally:
        c.stop()


def sees(runner: BackendNode, online: dict[str, str], topic: str = "job/x") -> None:
    """Until `runner` knows exactly these members of GROUP, each online on its node."""

    def read() -> bool:
        broker = runner.node.broker
        members = broker.trie.match_shared(topic).get(GROUP, [])
        if {c for c, _ in members} != set(online):
            return False
        view = broker.logstate.view
        for client_id, node_id in online.items():
            entry = view.session(client_id)
            if entry is None or not entry.online or entry.node != node_id:
                return False
        return True

    wait_until(lambda: bool(runner.call(read)), f"{runner.settings.node_id} sees {online}",
               PROPAGATION_S)  # fmt: skip


def offline(runner: BackendNode, client_id: str) -> bool:
    def read() -> bool:
        entry = runner.node.broker.logstate.view.session(client_id)
        return entry is not None and not entry.online

    return bool(runner.call(read))


def member(made: list[Paho], port: int, name: str, v5: bool = True, **kw: Any) -> Paho:
    """A Paho member of GROUP, also subscribed to its own barrier topic bar/<name>
    (first: a node that has seen the member in the log has seen that too)."""
    client = Paho(port, name, v5=v5, **kw)
    made.append(client)
    client.connack()
    client.subscribe(f"bar/{name}", 1)
    client.subscribe(SHARED, 1)
    return client


def publisher(made: list[Paho], port: int, name: str, v5: bool = True) -> Paho:
    client = Paho(port, name, v5=v5)
    made.append(client)
    client.connack()
    return client


def collect(members: dict[str, Paho], n: int) -> dict[str, list[bytes]]:
    """What each member got until n messages have come in all (bounded)."""
    got: dict[str, list[bytes]] = {name: [] for name in members}
    deadline = time.monotonic() + COLLECT_S
    while sum(map(len, got.values())) < n:
        assert time.monotonic() < deadline, f"only {got} of {n} messages"
        for name, client in members.items():
            with contextlib.suppress(queue.Empty):
                got[name].append(client.messages.get(timeout=0.05).payload)
    return got


def no_more(members: dict[str, Paho], pub: Paho) -> None:
    """Nothing else comes to any member ahead of a barrier sent after everything."""
    for name, client in members.items():
        assert client.before_barrier(pub, f"bar/{name}", 1) == [], name


def publish(pub: Paho, n: int, tag: str = "m", topic: str = "job/x") -> list[bytes]:
    payloads = [b"%s-%d" % (tag.encode(), i) for i in range(n)]
    for payload in payloads:
        pub.publish(topic, payload, 1)
    return payloads


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_members_only_on_the_other_node_get_every_message_once(
    cluster: Cluster, clients: list[Paho], v5: bool
) -> None:
    """Before: A dropped every message (no local member). Now each goes to one member on B."""
    a, b = cluster.start("a"), cluster.start("b")
    cluster.linked()
    members = {name: member(clients, b.mqtt_port, name, v5) for name in ("b1", "b2")}
    sees(a, {"b1": "b", "b2": "b"})
    pub = publisher(clients, a.mqtt_port, "pub-a", v5)
    sent = publish(pub, 12)
    got = collect(members, 12)
    assert sorted(got["b1"] + got["b2"]) == sorted(sent)
    assert got["b1"] and got["b2"], f"round robin used both members: {got}"
    no_more(members, pub)


def crc_pick(sender: str, members: list[str]) -> str:
    return sorted(members)[zlib.crc32(sender.encode()) % len(members)]


@pytest.mark.parametrize(
    "strategy",
    ["round_robin", "round_robin_per_group", "random", "sticky", "hash_clientid", "hash_topic"],
)
def test_a_member_on_each_node_per_strategy(
    cluster: Cluster, clients: list[Paho], strategy: str
) -> None:
    a = cluster.start("a", shared_subscription_strategy=strategy)
    b = cluster.start("b", shared_subscription_strategy=strategy)
    cluster.linked()
    members = {"a1": member(clients, a.mqtt_port, "a1"), "b1": member(clients, b.mqtt_port, "b1")}
    sees(a, {"a1": "a", "b1": "b"})
    pubs = [publisher(clients, a.mqtt_port, "pub-1"), publisher(clients, a.mqtt_port, "pub-2")]
    sent = publish(pubs[0], 10, "p1", "job/one") + publish(pubs[1], 10, "p2", "job/two")
    got = collect(members, 20)
    assert sorted(got["a1"] + got["b1"]) == sorted(sent)
    no_more(members, pubs[0])
    by_pub = {
        (name, tag): sum(p.startswith(tag) for p in payloads)
        for name, payloads in got.items()
        for tag in (b"p1", b"p2")
    }
    if strategy.startswith("round_robin"):  # spread across both nodes, alternating
        assert len(got["a1"]) == len(got["b1"]) == 10
    if strategy == "round_robin":  # a counter per publisher
        assert set(by_pub.values()) == {5}
    if strategy in ("sticky", "hash_clientid", "hash_topic"):  # each publisher and topic: one
        assert sorted(by_pub.values()) == [0, 0, 10, 10]
    if strategy == "hash_clientid":  # the same member on every node: CRC-32 over sorted ids
        for sender, tag in (("pub-1", b"p1"), ("pub-2", b"p2")):
            assert by_pub[(crc_pick(sender, ["a1", "b1"]), tag)] == 10
    if strategy == "sticky":  # kept until it leaves, then the other member
        stuck = next(name for (name, tag), n in by_pub.items() if tag == b"p1" and n == 10)
        other = "b1" if stuck == "a1" else "a1"
        members.pop(stuck).close()
        sees(a, {other: other[0]})
        later = publish(pubs[0], 5, "late")
        assert collect(members, 5)[other] == later
        no_more(members, pubs[0])


def test_local_member_first_when_preferred(cluster: Cluster, clients: list[Paho]) -> None:
    a = cluster.start("a", shared_local=True)
    b = cluster.start("b", shared_local=True)
    cluster.linked()
    members = {"a1": member(clients, a.mqtt_port, "a1"), "b1": member(clients, b.mqtt_port, "b1")}
    sees(a, {"a1": "a", "b1": "b"})
    sees(b, {"a1": "a", "b1": "b"})
    pub_a, pub_b = (
        publisher(clients, a.mqtt_port, "pub-a"),
        publisher(clients, b.mqtt_port, "pub-b"),
    )
    from_a, from_b = publish(pub_a, 6, "a"), publish(pub_b, 6, "b")
    got = collect(members, 12)
    assert got == {"a1": from_a, "b1": from_b}
    no_more(members, pub_a)
    members.pop("a1").close()  # no member on A any more: B's gets A's messages
    sees(a, {"b1": "b"})
    later = publish(pub_a, 4, "later")
    assert collect(members, 4) == {"b1": later}
    no_more(members, pub_a)


@pytest.mark.parametrize("level", LEVELS)
def test_qos1_to_a_persistent_member_elsewhere_survives_its_disconnect(
    cluster: Cluster, clients: list[Paho], raws: list[Raw], level: int
) -> None:
    """A's copies for a persistent member online on B go into its Redis queue: they
    are resent (DUP) after it drops unacknowledged; one published while it is
    offline (the only member) waits in its queue too; it comes back on A."""
    a, b = cluster.start("a"), cluster.start("b")
    cluster.linked()
    kw: dict[str, Any] = {"clean_start": False}
    if level == V5:
        kw["properties"] = Properties(session_expiry_interval=300)
    p = opened(raws, b, "pers", level, **kw)
    assert p.subscribe(Subscription(SHARED, 1)).reason_codes == (1,)
    sees(a, {"pers": "b"})
    pub = publisher(clients, a.mqtt_port, "pub-a", level == V5)
    sent = publish(pub, 3)
    first = [p.expect(Publish) for _ in sent]
    assert [(m.payload, m.qos, m.dup) for m in first] == [(s, 1, False) for s in sent]
    p.close()  # no PUBACK
    wait_until(lambda: offline(a, "pers"), "A sees pers offline", PROPAGATION_S)
    away = publish(pub, 1, "away")  # sent on no connection: DUP 0 when it comes
    again = opened(raws, a, "pers", level, **kw)
    resent = [again.expect(Publish) for _ in range(4)]
    assert [(m.payload, m.dup) for m in resent] == [(s, True) for s in sent] + [(away[0], False)]


@pytest.mark.parametrize("level", LEVELS)
def test_leaving_member_hands_its_unacked_to_a_member_on_a_third_node(
    cluster: Cluster, clients: list[Paho], raws: list[Raw], level: int
) -> None:
    """m1 on B takes every message (hash_clientid) and leaves without PUBACK, with
    one inflight and the rest queued; B sends them all to m2 on C, once each."""
    nodes = {n: cluster.start(n, shared_subscription_strategy="hash_clientid") for n in "abc"}
    cluster.linked()
    kw: dict[str, Any] = {}
    if level == V5:
        kw["properties"] = Properties(receive_maximum=1)
    m1 = opened(raws, nodes["b"], "m1", level, **kw)
    assert m1.subscribe(Subscription(SHARED, 1)).reason_codes == (1,)
    m2 = member(clients, nodes["c"].mqtt_port, "m2", level == V5)
    sees(nodes["a"], {"m1": "b", "m2": "c"})
    sees(nodes["b"], {"m1": "b", "m2": "c"})
    sender = next(s for s in (f"pub-{i}" for i in range(64)) if crc_pick(s, ["m1", "m2"]) == "m1")
    pub = publisher(clients, nodes["a"].mqtt_port, sender, level == V5)
    sent = publish(pub, 4)
    assert m1.expect(Publish).payload == sent[0]
    m1.close()  # its clean session ends on B with every message unacknowledged
    got = collect({"m2": m2}, 4)
    assert sorted(got["m2"]) == sorted(sent)
    # A barrier from B: a second copy from B would be on the same link ahead of it.
    no_more({"m2": m2}, publisher(clients, nodes["b"].mqtt_port, "pub-b", level == V5))


def test_members_on_a_dead_node_are_skipped(
    cluster: Cluster, clients: list[Paho], redis_url: str, tmp_path: Path
) -> None:
    """B, a `weir up` process, is killed: B logs nothing for b1, so A's directory
    may still say b1 is online there. Once membership says B is dead, every
    message goes to a1 (none is forwarded to the dead node)."""
    a = cluster.start("a")
    b = NodeProc(
        "b", redis_url, cluster.bootstrap, cluster.prefix, tmp_path, ["--cluster-ttl", "2"]
    )  # its heartbeat lapses 2 s after the kill
    try:
        router = a.node.services.cluster
        wait_until(functools.partial(router.links.is_connected, "b"), "A linked to B",
                   PROPAGATION_S)  # fmt: skip
        members = {"a1": member(clients, a.mqtt_port, "a1"), "b1": member(clients, b.port, "b1")}
        sees(a, {"a1": "a", "b1": "b"})
        pub = publisher(clients, a.mqtt_port, "pub-a")
        got = collect(members, len(publish(pub, 4)))
        assert (len(got["a1"]), len(got["b1"])) == (2, 2)
        b.proc.kill()
        b.proc.wait()
        del members["b1"]
        wait_until(lambda: not a.call(lambda: router.is_live("b")), "A sees B dead",
                   PROPAGATION_S)  # fmt: skip
        later = publish(pub, 6, "later")
        assert collect(members, 6) == {"a1": later}
        no_more(members, pub)
    finally:
        b.stop()


def test_puback_for_a_persistent_member_elsewhere_waits_for_redis(
    cluster: Cluster, raws: list[Raw], redis_url: str
) -> None:
    """The copy for a persistent member on B is stored by A before A answers:
    with Redis's writes paused, no PUBACK comes; once they resume, it does, and
    the member gets the message."""
    import redis

    a, b = cluster.start("a"), cluster.start("b")
    cluster.linked()
    props = Properties(session_expiry_interval=300)
    p = opened(raws, b, "pers", V5, clean_start=False, properties=props)
    assert p.subscribe(Subscription(SHARED, 1)).reason_codes == (1,)
    sees(a, {"pers": "b"})
    pub = opened(raws, a, "pub-a", V5)
    with redis.Redis.from_url(redis_url) as admin:
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        pub.send(Publish("job/x", b"stored-first", qos=1, packet_id=7))
        assert pub.nothing(within=PAUSE_MS / 2000), "PUBACK before the store took the copy"
    assert pub.expect(Puback, timeout=COLLECT_S).packet_id == 7
    got = p.expect(Publish, timeout=COLLECT_S)
    assert (got.payload, got.qos) == (b"stored-first", 1)

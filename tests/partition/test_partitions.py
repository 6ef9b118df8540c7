"""Partitions with real network faults (issue 23): one link cut at a time.

Two nodes, Redis and the Kafka-protocol broker each in a network namespace
of their own, joined by veth links (tests.partition.cluster); the link is
cut with `ip link set down` on both ends and brought back up. For each of
node <-> Redis, node <-> Kafka, node <-> node and clients <-> node, a
workload of persistent QoS 1/2 publishers and subscribers and a will client
(tests.partition.scenario) runs across the fault, and the test checks: no
acknowledged message lost, no QoS 2 message delivered twice, the will
published exactly when the client lost its connection, and once the link
is back, every live node's view agrees with a replay of the log (`weir
streams verify`). Each row of the table the issue asks for is printed at
the end of the run (conftest's terminal summary).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from services.mqtt.packets import (
    Connack,
    Connect,
    Properties,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from tests.chaos.harness import LEVEL_5, Link, connect_retry
from tests.partition.cluster import Cluster
from tests.partition.scenario import Outcome, Scenario, drops

# serial: scripts/test.sh runs these in one process after the xdist workers: the
# cluster fixture builds namespaces, nodes, Redis and Kafka once, and conftest's
# summary prints the ROWS these tests fill in, which a worker's copy would keep
pytestmark = [pytest.mark.partition, pytest.mark.serial, pytest.mark.timeout(180)]

ROWS: list[Outcome] = []
SERVER_UNAVAILABLE = 0x88  # CONNACK, 5.0
IMPLEMENTATION_SPECIFIC = 0x83  # SUBACK, 5.0: what a SUBSCRIBE the log did not take gets


def check(cluster: Cluster, outcome: Outcome) -> None:
    ROWS.append(outcome)
    try:
        assert outcome.acked_lost == 0, outcome.missing
        assert outcome.qos2_duplicates == 0
        assert outcome.wills == outcome.wills_expected
        assert outcome.converge_s is not None, "the subscribers never had every message"
        assert cluster.verify() == []
    except AssertionError as exc:  # pytest's temp dirs rotate: keep the nodes' logs
        kept = cluster.keep_logs()
        raise AssertionError(f"{exc} (the nodes' logs: {kept})") from None


async def test_node_cut_from_redis_fences_itself_and_loses_nothing(cluster: Cluster) -> None:
    """Node a cannot reach Redis for twice the cluster TTL: it fences itself at
    TTL/2 (DISCONNECT 0x9C, CONNECT 0x88), b takes its sessions over at TTL and
    publishes the will of the client a dropped, once; a rejoins when healed."""
    hold = 2 * cluster.ttl_s
    s = Scenario(cluster, "redis", publisher_home="a", subscriber_home="a", will_home="a")
    await s.start(hold)
    assert s.will is not None
    began = time.monotonic()
    dropped_after: list[float] = []

    async def watch() -> None:
        while s.will is not None and not s.will.drops:
            await asyncio.sleep(0.02)  # a poll of the will client's state
        dropped_after.append(time.monotonic() - began)

    await s.fault(hold, lambda: cluster.topology.cut("a", "redis"),
                  lambda: cluster.topology.heal("a", "redis"), watch)  # fmt: skip
    converge = await s.settle()
    assert s.wills_due() == 1  # a dropped the will client when it fenced itself
    wills = await s.wills_settled(1)
    saw = f"dropped by a after {dropped_after[0]:.1f} s; {drops(s)}"
    await s.stop()
    check(cluster, s.outcome("node a <-> Redis", saw, wills, 1, converge))
    assert dropped_after[0] < cluster.ttl_s  # fenced before b could take anything over


async def test_node_cut_from_kafka_refuses_connect_and_subscribe(cluster: Cluster) -> None:
    """Node a cannot reach Kafka: its connected clients go on (their messages
    need Redis only), a CONNECT or SUBSCRIBE there (they need the log) is
    refused with a reason code, a session that ends there meanwhile has its
    end logged once the log is back, and a has caught up with what b logged
    meanwhile (a subscription made on b routes a's publishes)."""
    hold = 2 * cluster.ttl_s
    s = Scenario(cluster, "kafka", publisher_home="a", subscriber_home="a", will_home="a")
    await s.start(hold)
    refusals: list[str] = []

    kept: list[Link] = []

    async def during() -> None:
        # A fresh 5.0 CONNECT to a (its session must be logged before the CONNACK).
        began = time.monotonic()
        props = Properties(session_expiry_interval=60)
        late = Connect("kafka-late", LEVEL_5, properties=props)
        reader, writer = await cluster.nodes["a"].dial()
        link = Link(reader, writer, LEVEL_5)
        link.send(late)
        connack = await asyncio.wait_for(link.recv(), 30.0)
        link.close()
        assert isinstance(connack, Connack)
        refusals.append(f"CONNECT {connack.reason_code:#x} after {time.monotonic() - began:.1f} s")
        # A SUBSCRIBE on b (which has the log), then one on a connection a took before.
        link, _ = await Link.open(cluster.nodes["b"], Connect("kafka-b", LEVEL_5))
        link.send(Subscribe(1, (Subscription("late/kafka", 1),)))
        assert isinstance(await link.recv(), Suback)
        kept.append(link)
        began = time.monotonic()
        sub = early[0]
        sub.send(Subscribe(1, (Subscription("x/kafka", 1),)))
        suback = await asyncio.wait_for(sub.recv(), 30.0)
        assert isinstance(suback, Suback)
        refusals.append(f"SUBACK {suback.reason_codes[0]:#x} after "
                        f"{time.monotonic() - began:.1f} s")  # fmt: skip
        sub.close()  # its session ends during the cut: the log must still get that end

    early = [(await Link.open(cluster.nodes["a"], Connect("kafka-sub", LEVEL_5)))[0]]
    await s.fault(hold, lambda: cluster.topology.cut("a", "kafka"),
                  lambda: cluster.topology.heal("a", "kafka"), during)  # fmt: skip
    # Caught up: a routes its publisher's message to the subscription b logged meanwhile.
    healed = s.healed_at  # a takes CONNECTs again once its log acknowledges again
    publisher, _ = await connect_retry(cluster.nodes["a"], Connect("kafka-pub-late"), healed + 15)
    refusals.append(f"CONNECT accepted {time.monotonic() - healed:.1f} s after the heal")
    got = None
    while got is None:  # QoS 0 probes until one reaches the subscriber on b
        assert time.monotonic() < healed + 60, "a never caught up with b's subscription"
        publisher.send(Publish("late/kafka", b"after"))
        with contextlib.suppress(TimeoutError):
            got = await asyncio.wait_for(kept[0].recv(), 0.2)
    assert isinstance(got, Publish) and got.payload == b"after", got
    refusals.append(f"caught up {time.monotonic() - healed:.1f} s after the heal")
    for link in [publisher, *kept]:
        link.close()
    converge = await s.settle()
    due = s.wills_due()  # 0: a keeps its clients (1 only if Redis stalled and a fenced itself)
    wills = await s.wills_settled(due)
    await s.stop()
    saw = "; ".join([*refusals, drops(s)])
    check(cluster, s.outcome("node a <-> Kafka", saw, wills, due, converge))
    assert refusals[0].startswith(f"CONNECT {SERVER_UNAVAILABLE:#x}"), refusals
    assert refusals[1].startswith(f"SUBACK {IMPLEMENTATION_SPECIFIC:#x}"), refusals
    # The first append finds the log down within its bound (5 s: a cut link stays
    # silent); from then on a refuses at once (DOWN_APPEND_TIMEOUT_S), not after 5 s each.
    connect_s, suback_s = (float(r.split(" after ")[1].split()[0]) for r in refusals[:2])
    assert connect_s < 5.0 + 1.0 and suback_s < 1.0, refusals


async def test_nodes_cut_from_each_other(cluster: Cluster) -> None:
    """a and b cannot reach each other, both reach Redis and Kafka: a's
    publishers' messages for b's persistent subscribers wait in Redis and
    arrive, every one, once the link is back; no will (nobody was dropped)."""
    hold = cluster.ttl_s * 1.5
    s = Scenario(cluster, "peers", publisher_home="a", subscriber_home="b", will_home="a")
    await s.start(hold)
    await s.fault(hold, lambda: cluster.topology.cut("a", "b"),
                  lambda: cluster.topology.heal("a", "b"))  # fmt: skip
    converge = await s.settle()
    due = s.wills_due()  # 0: nobody is dropped (1 only if Redis stalled and a fenced itself)
    wills = await s.wills_settled(due)
    await s.stop()
    check(cluster, s.outcome("node a <-> node b", drops(s), wills, due, converge))


async def test_clients_cut_from_their_node(cluster: Cluster) -> None:
    """a's clients lose their link to a (a keeps Redis, Kafka and b): they
    notice (as a keep-alive would) and resume on b, taking their sessions
    over; a ends the will client's connection after 1.5 keep alives and its
    will goes out once. (It failed now and then on a loaded machine: b's own
    tail could apply a resuming subscriber's SessionOpened before b had the
    session in its table, and b's publishes then reached nobody, see
    tests/integration/test_tail_ahead_of_connect.py; and a fence of b could
    drop the clean will watcher while the will went out.)"""
    hold = 2 * cluster.ttl_s
    s = Scenario(cluster, "clients", publisher_home="a", subscriber_home="a", will_home="a")
    await s.start(hold)
    dropped: list[int] = []

    async def notice() -> None:
        await asyncio.sleep(1.0)  # the clients' keep-alive finding the link dead
        dropped.append(cluster.nodes["a"].drop_clients())

    await s.fault(hold, lambda: cluster.topology.cut("clients", "a"),
                  lambda: cluster.topology.heal("clients", "a"), notice)  # fmt: skip
    converge = await s.settle()
    assert s.wills_due() == 1  # the will client's link was cut too
    wills = await s.wills_settled(1)
    await s.stop()
    saw = f"{dropped[0]} connections gave up on a after 1 s; {drops(s)}"
    check(cluster, s.outcome("clients <-> node a", saw, wills, 1, converge))

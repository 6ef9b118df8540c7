"""Cluster chaos (issue 10): three nodes, a random one SIGKILLed 12 times, nothing lost.

Three `weir up` processes (n1, n2, n3) on one durable redis-server
(appendfsync always) and one private embedded Kafka, with a short
`--cluster-ttl`. Clients are spread over the nodes (each has a home node)
and, whenever their connection drops, reconnect to any live node, trying
the nodes in a fresh random order (`harness.Ports`):

- publishers, one per node at first: QoS 2, QoS 1, QoS 2, together RATE
  msg/s; payloads are ids (`id % 3` names the publisher, `id // 3` is its
  sequence number);
- persistent subscribers to `chaos/+`: online throughout (3.1.1 QoS 1, 5.0
  QoS 2) and coming and going without ever subscribing again (5.0 QoS 1,
  3.1.1 QoS 2: what was published while they were away can only come from
  their stored queue, on whatever node they come back to);
- clean subscribers, subscribing on every connection: QoS 0 (3.1.1 and 5.0)
  and a 5.0 QoS 2 one;
- a shared group `$share/g/chaos/+` of three persistent QoS 2 members, one
  per node at first (3.1.1, 5.0, 3.1.1).

A barrier first: each node publishes probes until every subscriber (and
the group) got one from it, so every node routes to every subscription.
Then the seeded schedule (the seed is printed; WEIR_CHAOS_SEED replays it)
SIGKILLs a random node KILLS times, a random while after the previous
restart, and restarts it on the same port and id: half the time at once
("quick": back within the TTL, so it ends its previous run's sessions
itself), half the time only once its heartbeat record lapsed and a while
more ("slow": the survivors noticed the death and took over its sessions).
The test watches the heartbeat record and reports for each kill whether it
lapsed.

Then, once every publisher has every message acknowledged (PUBACK /
PUBREC; a publisher resends after each reconnect):
- every persistent subscriber, and the shared group as a whole, has every
  message (none missing);
- QoS 2 subscribers' application, and the shared group as a whole, saw
  each message of a QoS 2 publisher exactly once; a QoS 1 subscriber got
  duplicates of them only with DUP=1 (the broker holds a QoS 2 publisher's
  packet ids in Redis, so a resend through another node is not a new
  message); duplicates without DUP=1 of a QoS 1 publisher's messages only
  for the ones that publisher resent (QoS 1 is at least once);
- per-publisher order (DESIGN 4: a persistent queue keeps its publish order,
  a reconnect gets its inflight with DUP=1 then its queue): on each
  connection of a persistent non-shared subscriber, no delivery without
  DUP=1 below an earlier one of the same publisher, unless the publisher
  resent it after a reconnect (then the resend is the copy that came
  late). Shared members are not ordered (each gets a subset; a redispatched
  copy comes late by design): their inversions are reported only;
- clean subscribers' loss is printed, not asserted (a clean session dies
  with its node); a QoS 2 message reaches them at most once: its copies for
  memory-tier subscribers (clean, here or forwarded) wait until its packet
  id is stored with its durable copies (`Dispatch._route_qos2`), so the
  publisher's resend through another node after a death is known as one.
The figures line (=== ... ===) is the one to quote.

The same run on a Redis Cluster (`test_cluster_sigkill_loses_nothing_on_
redis_cluster`): 3 primaries and 3 replicas (durable profile), fewer kills
(CLUSTER_KILLS, to fit the CI budget) and, halfway through them, one
primary failover: CLUSTER FAILOVER on a replica of a random primary while
the publishers run (a manual failover: the primary stops taking writes,
the replica catches up, then takes over its slots; nothing acknowledged is
lost, so no `--redis-wait` is needed; a SIGKILLed primary would lose what
it had acknowledged and not yet replicated). The nodes' calls in flight
to that primary fail (their clients reconnect or resend), the rest follow
the new slot map. Same checks.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.cluster.membership import KEY_PREFIX
from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_cluster import LocalRedisCluster
from services.embedded.redis_server import RedisServer
from services.mqtt.packets import Connect, Publish
from services.ports import free_port
from services.session.redis import connect
from tests.chaos.clients import (
    OfflineSubscriber,
    Publisher,
    Subscriber,
    until_complete_or_drained,
)
from tests.chaos.cluster_figures import Cast, Kill, Tally, all_ids, group_seen, report
from tests.chaos.harness import (
    LEVEL,
    LEVEL_5,
    Link,
    NodeProcess,
    Ports,
)
from tests.support.wait import until

# serial: the run loads both cores against a deadline, so scripts/test.sh runs it
# alone, after the xdist workers (tests/support/parallel.py)
pytestmark = [
    pytest.mark.slow, pytest.mark.serial, pytest.mark.redis, pytest.mark.kafka,
    pytest.mark.timeout(300),
]  # fmt: skip

NODES = 3
RATE = 1000.0  # msg/s, all publishers together
PUBLISHER_QOS = (2, 1, 2)  # publisher i starts on node i
KILLS = 12  # half quick (restart at once), half slow (restart after the TTL), shuffled
CLUSTER_KILLS = 4  # on Redis Cluster: a shorter run (with its failover) for the CI budget
# On Redis Cluster: 6 redis-servers share the 2 cores with the nodes and Kafka, and a QoS 2
# PUBLISH costs 4 sequential round trips before its PUBREC (2 on one Redis):
# at 1,000 msg/s the QoS 2 publishers fell minutes behind here, at 150 (with other work on
# the machine) 25-37 s, past the 30 s completion bound.
CLUSTER_RATE = 60.0
CLUSTER_TTL_S = 4.0  # heartbeat TTL: a quick restart (1-2.5 s to join here) beats it
KILL_GAP_S = (1.0, 2.5)  # a kill comes this long after the previous restart was ready
DOWN_AFTER_LAPSE_S = (0.7, 1.5)  # slow kill: down this long after the lapse (> 1 poll, 0.5 s)
QUEUE_LIMIT = 200_000  # above the run: the kills alone are tested (test_node_kill: the bound)
ONLINE_S = (0.5, 1.5)  # an offline subscriber's online window
OFFLINE_S = (1.0, 3.0)  # and its offline window
READY_TIMEOUT_S = 30.0
PUBLISHERS_DONE_S = 30.0  # after the last kill: every outstanding message completed
BARRIER_S = 20.0
DRAINED_FOR_S = 3.0  # nothing stored for anyone this long, all connected: nothing more comes
RUN_DEADLINE_S = 200.0
TOPIC = "chaos/{}"  # publisher i publishes on chaos/i
FILTER = "chaos/+"
GROUP_FILTER = "$share/g/chaos/+"


def _cast(rng: random.Random, ports: list[int], rate: float) -> Cast:
    def at(home: int) -> Ports:
        return Ports(ports, random.Random(rng.getrandbits(64)), home % NODES)

    gate, settle = asyncio.Event(), asyncio.Event()
    gate.set()
    cast = Cast(
        publishers=[
            Publisher(f"chaos-pub{i}", TOPIC.format(i), 1 << 30, rate / len(PUBLISHER_QOS),
                      qos=qos, stride=len(PUBLISHER_QOS), offset=i)
            for i, qos in enumerate(PUBLISHER_QOS)
        ],
        online=[
            Subscriber("chaos-on-v311-q1", FILTER, 1),
            Subscriber("chaos-on-v5-q2", FILTER, 2, level=LEVEL_5),
        ],
        offline=[
            OfflineSubscriber(
                f"chaos-off-{'v5' if level == LEVEL_5 else 'v311'}-q{qos}", FILTER, qos,
                level=level, rng=random.Random(rng.getrandbits(64)), online_s=ONLINE_S,
                offline_s=OFFLINE_S, gate=gate, settle=settle,
            )
            for level, qos in ((LEVEL_5, 1), (LEVEL, 2))
        ],
        clean=[
            Subscriber("chaos-clean-v311", FILTER, 0, clean=True),
            Subscriber("chaos-clean-v5", FILTER, 0, level=LEVEL_5, clean=True),
            Subscriber("chaos-clean-v5-q2", FILTER, 2, level=LEVEL_5, clean=True),
        ],
        members=[
            Subscriber(f"chaos-member{i}", GROUP_FILTER, 2, level=level)
            for i, level in enumerate((LEVEL, LEVEL_5, LEVEL))
        ],
    )  # fmt: skip
    homes = [p.client_id for p in cast.publishers] + [m.client_id for m in cast.members]
    spread = [s.client_id for s in [*cast.online, *cast.offline, *cast.clean]]
    for i, client_id in enumerate(homes):  # one per node, in order
        cast.ports[client_id] = at(i)
    for i, client_id in enumerate(spread):
        cast.ports[client_id] = at(i + 1)
    return cast


def _nodes(tmp_path: Path, redis_url: str, kafka: str) -> dict[str, NodeProcess]:
    nodes = {}
    for i in range(NODES):
        port = free_port()
        node_id = f"n{i + 1}"
        args = [
            "--host", "127.0.0.1", "--mqtt-port", str(port), "--ws-port", "off",
            "--node-id", node_id, "--data-dir", str(tmp_path / node_id),
            "--redis", redis_url, "--kafka", kafka,
            "--cluster-ttl", str(CLUSTER_TTL_S), "--queue-limit", str(QUEUE_LIMIT),
        ]  # fmt: skip
        nodes[node_id] = NodeProcess(args, port, tmp_path / f"{node_id}.log")
    return nodes


async def test_cluster_sigkill_loses_nothing(
    tmp_path: Path, durable_redis: RedisServer, private_kafka: EmbeddedKafka
) -> None:
    await _chaos(tmp_path, durable_redis.url, private_kafka.bootstrap, KILLS)


async def test_cluster_sigkill_loses_nothing_on_redis_cluster(
    tmp_path: Path, private_kafka: EmbeddedKafka
) -> None:
    with LocalRedisCluster(tmp_path / "redis-cluster", profile="durable") as cluster:
        await _chaos(tmp_path, cluster.url, private_kafka.bootstrap, CLUSTER_KILLS, cluster)


async def _chaos(
    tmp_path: Path, redis_url: str, kafka: str, count: int,
    cluster: LocalRedisCluster | None = None,
) -> None:  # fmt: skip
    seed = int(os.environ.get("WEIR_CHAOS_SEED", random.randrange(1 << 32)))
    print(f"\ncluster chaos seed {seed} (WEIR_CHAOS_SEED={seed} replays the kill schedule)")
    rng = random.Random(seed)
    nodes = _nodes(tmp_path, redis_url, kafka)
    for node in nodes.values():
        node.start()
    cast = _cast(rng, [n.port for n in nodes.values()], RATE if cluster is None else CLUSTER_RATE)
    began = time.monotonic()
    kills: list[Kill] = []
    try:
        for node in nodes.values():
            await node.wait_ready(READY_TIMEOUT_S)
        await _run(nodes, cast, rng, redis_url, kills, count, cluster)
    finally:
        for node in nodes.values():
            node.stop()
        tallies = report(seed, began, cast, kills, nodes)
    _check(cast, kills, tallies, count, one_redis=cluster is None)


async def _run(
    nodes: dict[str, NodeProcess],
    cast: Cast,
    rng: random.Random,
    redis_url: str,
    kills: list[Kill],
    count: int,
    cluster: LocalRedisCluster | None,
) -> None:
    deadline = time.monotonic() + RUN_DEADLINE_S
    redis = connect(redis_url)
    tasks = [asyncio.create_task(s.run(cast.ports[s.client_id], deadline)) for s in cast.listeners]
    publishing: list[asyncio.Task[None]] = []
    settle = cast.offline[0].settle
    try:
        await until(lambda: all(s.subscribed for s in cast.listeners), timeout=15)
        await _barrier(nodes, cast)
        publishing = [
            asyncio.create_task(p.run(cast.ports[p.client_id], deadline)) for p in cast.publishers
        ]
        started = time.monotonic()
        quick = [i % 2 == 0 for i in range(count)]
        rng.shuffle(quick)
        for n, fast in enumerate(quick):
            await asyncio.sleep(rng.uniform(*KILL_GAP_S))  # the random moment itself
            if cluster is not None and n == count // 2:
                await _failover(cluster, rng)
            node_id = rng.choice(sorted(nodes))
            away = [s.client_id for s in cast.offline if s.offline]
            kills.append(await _kill(node_id, nodes[node_id], fast, rng, redis))
            kills[-1].away = away
        for p in cast.publishers:
            p.finish()
        cast.publish_s = time.monotonic() - started
        await asyncio.wait_for(asyncio.gather(*publishing), PUBLISHERS_DONE_S)
        settle.set()
        expected = all_ids(cast)
        await until_complete_or_drained(
            redis,
            lambda: (
                not any(expected - s.seen for s in cast.persistent)
                and not expected - group_seen(cast)
            ),
            cast.listeners,
            [s.client_id for s in [*cast.persistent, *cast.members]],
            deadline,
            DRAINED_FOR_S,
        )
    finally:
        settle.set()
        for s in cast.listeners:
            s.stop.set()
        for task in publishing:
            task.cancel()
        results = await asyncio.gather(*tasks, *publishing, return_exceptions=True)
        await redis.aclose()
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            print(f"client errors: {errors!r}")
            for node in nodes.values():
                print(f"{node.log_path.name} tail:\n{node.log_tail(15)}")


async def _barrier(nodes: dict[str, NodeProcess], cast: Cast) -> None:
    """Each node publishes QoS 1 probes (payload -1 - its index) until every
    listener, and some member of the group, got one: every node routes to every
    subscription (they reach other nodes through the log)."""
    links = [
        (await Link.open(n.port, Connect(f"chaos-probe-{node_id}")))[0]
        for node_id, n in nodes.items()
    ]
    solo = [*cast.persistent, *cast.clean]
    pid = 0
    try:
        deadline = time.monotonic() + BARRIER_S
        for i, link in enumerate(links):
            probe = -1 - i
            while not (
                all(probe in s.seen for s in solo) and any(probe in m.seen for m in cast.members)
            ):
                if time.monotonic() > deadline:
                    raise AssertionError(f"node {i + 1}: probes not everywhere in {BARRIER_S}s")
                pid = pid % 65535 + 1
                link.send(Publish("chaos/probe", str(probe).encode(), 1, packet_id=pid))
                await link.drain()
                await asyncio.sleep(0.25)  # the next probe's pace; the loop waits on `seen`
    finally:
        for link in links:
            link.close()


async def _kill(
    node_id: str, node: NodeProcess, quick: bool, rng: random.Random, redis: aioredis.Redis
) -> Kill:
    key = KEY_PREFIX + node_id
    kill = Kill(node_id, quick, time.monotonic())
    node.kill()
    watching = asyncio.Event()

    async def watch() -> None:  # was the record ever gone before the node was ready?
        while not watching.is_set():
            if not await redis.exists(key):
                kill.lapsed = True
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        if not quick:
            await until(lambda: kill.lapsed, timeout=CLUSTER_TTL_S + 5)
            await asyncio.sleep(rng.uniform(*DOWN_AFTER_LAPSE_S))  # down a while: the scenario
        node.start()
        kill.restart_s = await node.wait_ready(READY_TIMEOUT_S)
    finally:
        watching.set()
        await watcher
    return kill


async def _failover(cluster: LocalRedisCluster, rng: random.Random) -> None:
    primary = rng.choice(sorted(await asyncio.to_thread(cluster.primaries)))
    replica = await asyncio.to_thread(cluster.replica_of, primary)
    began = time.monotonic()
    await asyncio.to_thread(cluster.failover, replica)
    took = time.monotonic() - began
    print(f"redis cluster: primary :{primary} failed over to :{replica} in {took:.2f} s")
    assert replica in await asyncio.to_thread(cluster.primaries)


def _check(
    cast: Cast, kills: list[Kill], tallies: dict[str, Tally], count: int, one_redis: bool = True
) -> None:
    """On Redis Cluster (`one_redis` False) two checks are reported, not asserted:
    - QoS 2 once, and no QoS 1 copy twice (DUP=0 duplicates): a batch split over
      hash slots is not atomic, so a node killed (or a primary failed over)
      between its slots' calls leaves copies stored whose publisher's resend
      stores them again: at least once (docs/redis.md; seen once in CI, a
      3.1.1 QoS 1 subscriber got one message twice);
    - a quick restart back within the TTL: a node takes 9-14 s to be ready
      here with six redis-servers on the two cores (1-2.5 s on one Redis), so
      every kill is a lapsed one (the survivors' takeover path)."""
    assert len(kills) == count
    quick = [k for k in kills if k.quick]
    assert all(k.lapsed for k in kills if not k.quick)
    if one_redis:
        assert any(not k.lapsed for k in quick), "no quick restart came back within the TTL"
    for p in cast.publishers:
        assert p.done and p.sessions_lost == 0, f"{p.client_id}: not done or session lost"
    for s in [*cast.persistent, *cast.members]:
        assert s.sessions_lost == 0, f"{s.name}: session lost"
    for s in cast.offline:
        assert s.subscribes == 1
    for name, t in tallies.items():
        if name.startswith("chaos-clean"):
            if one_redis:
                assert t.qos2_twice == [], f"{t.name}: {len(t.qos2_twice)} QoS 2 messages twice"
            elif t.qos2_twice:  # the split batch again: the resend stored it twice
                print(f"{t.name}: {len(t.qos2_twice)} QoS 2 messages twice (at least once here)")
            continue  # their loss: printed above
        assert t.missing == [], f"{t.name}: {len(t.missing)} acknowledged messages missing"
        if one_redis:
            assert t.qos2_twice == [], f"{t.name}: {len(t.qos2_twice)} QoS 2 messages twice"
        if one_redis:
            assert t.dup0_unexplained == [], f"{t.name}: DUP=0 duplicates {t.dup0_unexplained[:8]}"
        elif t.dup0_unexplained:  # the same split batch, for a QoS 1 copy stored twice
            print(f"{t.name}: {len(t.dup0_unexplained)} DUP=0 duplicates (at least once here)")
        if name != "group":
            assert t.order_unexplained == [], f"{t.name}: order {t.order_unexplained[:8]}"

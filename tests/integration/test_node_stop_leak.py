"""A node started and stopped inside the test process leaves nothing behind.

The test suite runs hundreds of nodes in one pytest process. Each stop must
give back what its start took: sockets, threads (Python's and librdkafka's),
asyncio tasks, Redis connections, and the objects the start froze out of the
garbage collector's way (`gc.freeze`). Before: closing the node's Redis
client left its pool's connections open (the loop's end closed them); the
webhook's HTTP client was closed by `weir up` only, not by a node's stop; a
node on an existing log kept the Kafka admin client that had created its
topics (held in a traceback cycle, then frozen: four librdkafka threads and
a connection per start); and every start froze whatever earlier tests had
left to the collector (paho clients and their socket pairs, earlier nodes'
state) for the rest of the process. Here one node on real Redis and Kafka
with as many parts as there are (the Redis ban table and its channel,
connection and message rates and flapping counted in Redis, an ACL file and
Redis ACLs, the webhook of the authentication chain, a persistent session
with a will, QoS 2) is started and stopped three times on one log, and
after each stop everything is back to what it was before the first start.

Not counted (owned by the fixtures or the process): the webhook's server
side (its listening socket, the connections it accepted, its handler
threads), the session's redis-server and Kafka broker, and uvloop's
process-wide pool of libuv worker threads.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis

from services.config import Settings
from services.config.auth import AuthBackend
from services.mqtt.packets import (
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscription,
    Will,
)
from tests.auth.test_chain_webhook import webhook
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import V5, Raw
from tests.support.backend_node import BackendNode, backend_settings
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

RUNS = 3
SETTLE_S = 5.0  # Redis drops a closed connection from CLIENT LIST a moment after
PROCESS_WIDE_THREADS = ("libuv-worker",)  # uvloop's getaddrinfo pool, one per process
ACL = """
[[rule]]
permission = "allow"
topics = ["#"]
"""


class Probed(BackendNode):
    """A `BackendNode` that notes, once the node has stopped and `open_backends`
    has closed what it opened, the asyncio tasks still pending in its loop and
    the sockets open (before the loop closes: closing it would close leftovers)."""

    left: list[str]
    open_sockets: dict[str, int]

    def __init__(self, settings: Settings, ports: tuple[int, int, int], old: Baseline) -> None:
        super().__init__(settings)
        self.ports = ports
        self.old = old

    async def _main(self) -> None:
        await super()._main()
        me = asyncio.current_task()
        self.left = sorted(t.get_name() for t in asyncio.all_tasks() if t is not me)
        self.open_sockets = sockets(self.ports, self.old.sockets)


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


@dataclass(frozen=True)
class Baseline:
    """What the process had before the first start, by identity: the counts below
    leave it out, so only what a node opened and left can show. (Comparing counts
    took something of an earlier test's that closed meanwhile for a change: once
    in CI, a socket of its garbage, {'not tcp': 0} != {'not tcp': 1}.)"""

    sockets: frozenset[str]  # inodes
    redis: frozenset[str]  # Redis client ids


def baseline(redis_url: str) -> Baseline:
    return Baseline(socket_inodes(), frozenset(redis_client_ids(redis_url)))


def socket_inodes() -> frozenset[str]:
    inodes: set[str] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return frozenset(inodes)


def sockets(ports: tuple[int, int, int], old: frozenset[str]) -> dict[str, int]:
    """This process's sockets opened since `old`, by what they lead to; the
    webhook's server side not counted."""
    redis_port, kafka_port, hook_port = ports
    inodes = set(socket_inodes() - old)
    names = {redis_port: "redis", kafka_port: "kafka", hook_port: "webhook"}
    kinds: collections.Counter[str] = collections.Counter()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[9] not in inodes:
                    continue
                inodes.discard(fields[9])
                local, remote = _port(fields[1]), _port(fields[2])
                if local == hook_port:
                    continue  # the webhook's own (the fixture's)
                kinds["listening" if remote == 0 else names.get(remote, "tcp")] += 1
    if inodes:
        kinds["not tcp"] = len(inodes)
    return dict(kinds)


def threads() -> dict[str, int]:
    """Python threads by name (the webhook's handler threads not counted), and the
    native ones (librdkafka's, named rdk:*) by their OS name. Counted, not
    compared by id: the one run that compared ids failed on a new librdkafka
    bootstrap thread (rdk:broker-1) 5 s after the stop, which counting had not
    met in many runs; whose it was is not known (see the closing note)."""
    names = collections.Counter(
        t.name for t in threading.enumerate() if "process_request_thread" not in t.name
    )
    with open("/proc/self/comm") as f:
        mine = f.read().strip()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        if name != mine and not name.startswith(PROCESS_WIDE_THREADS):
            names[f"native {name}"] += 1
    return dict(names)


def redis_client_ids(redis_url: str) -> list[str]:
    with redis.Redis.from_url(redis_url, socket_timeout=5) as client:
        return [str(c["id"]) for c in client.client_list()]


def redis_clients(redis_url: str, old: frozenset[str]) -> list[str]:
    """The other connections Redis has (CLIENT LIST) opened since `old`, as
    "name/last command"."""
    with redis.Redis.from_url(redis_url, socket_timeout=5) as client:
        me = client.client_id()
        return sorted(
            f"{c.get('name') or '-'}/{c.get('cmd')}"
            for c in client.client_list()
            if int(c["id"]) != me and str(c["id"]) not in old
        )


@pytest.fixture
def settings(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[Settings, int]]:
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    with webhook(keep_alive=True) as (hook, url):  # the node's client keeps a connection
        hook.answers["user"] = "allow"
        base = backend_settings(redis_url, kafka_bootstrap, kafka_topic_prefix, "leak")
        limits = replace(
            base.limits,
            client_msg_rate="1000/second",
            max_conn_rate="1000/second",
            flapping=True,
            rate_storage="redis",
        )
        auth = (AuthBackend("http", url=url),)
        yield (
            replace(base, limits=limits, acl_file=str(acl), acl_redis=True, auth=auth),
            int(url.split(":")[2].split("/")[0]),
        )


def use(node: NodeRunner, run: int) -> None:
    """A persistent 5.0 session with a will, authenticated by the webhook: a
    subscription, a QoS 2 message to it, then the connection dropped."""
    client = Raw(node.mqtt_port, V5)
    try:
        ack = client.connect(
            "leak-client",
            clean_start=True,  # the last run's session (dropped: kept 600 s) discarded
            username="user",
            password=b"pw-user",
            will=Will("leak/will", b"gone", 1),
            properties=Properties(session_expiry_interval=600),
        )
        assert ack.reason_code == 0, ack
        client.subscribe(Subscription("leak/t", 1))
        client.send(Publish("leak/t", b"m%d" % run, qos=2, packet_id=7))
        got: dict[type, Any] = {}
        for _ in range(3):  # PUBREC and the message in either order, PUBCOMP after PUBREL
            packet = client.recv()
            got[type(packet)] = packet
            if isinstance(packet, Pubrec):
                client.send(Pubrel(7))
        assert set(got) == {Pubrec, Publish, Pubcomp}, got
        message = got[Publish]
        assert message.payload == b"m%d" % run and message.packet_id is not None
        client.send(Puback(message.packet_id))
    finally:
        client.close()  # no DISCONNECT: the will goes


def test_start_and_stop_leave_nothing_behind(
    settings: tuple[Settings, int], redis_url: str, kafka_bootstrap: str
) -> None:
    config, hook_port = settings
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
    ports = (redis_port, int(kafka_bootstrap.rsplit(":", 1)[1]), hook_port)
    gc.collect()  # earlier tests' garbage (paho's socket pairs): a node start collects it
    old = baseline(redis_url)
    before_threads = threads()
    back = ({}, before_threads, [])  # what `now` must come back to after each stop

    def now() -> tuple[dict[str, int], dict[str, int], list[str]]:
        return sockets(ports, old.sockets), threads(), redis_clients(redis_url, old.redis)

    for run in range(RUNS):
        node = Probed(config, ports, old)
        node.start()
        try:
            use(node, run)
            during = now()  # the counts see the node's connections and threads
            assert during[0].get("redis") and during[0].get("kafka"), during
            assert during[0].get("webhook") and during[2] and during[1] != before_threads
        finally:
            node.stop()
        assert node.left == [], f"run {run}: tasks left pending"
        assert node.open_sockets == {}, f"run {run}: sockets left open"
        try:
            wait_until(lambda: now() == back, f"run {run}: back to the baseline", SETTLE_S)
        except AssertionError:
            raise AssertionError(f"run {run}: {now()} != {back}") from None


class Holder:
    """Garbage that only the cyclic collector frees: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


def test_a_node_start_leaves_earlier_garbage_collectable() -> None:
    """What was garbage when a node started (a cycle, as a closed paho client
    and its socket pair are) is collected while it runs; the node's own state
    once it has stopped."""
    holder = Holder()
    gone = weakref.ref(holder)
    gc.collect()  # it survives into the oldest generation, as a test's clients do
    del holder  # garbage now, for a full collection only
    runner = NodeRunner(node_settings()).start()
    try:
        broker = weakref.ref(runner.node.broker)
        gc.collect()
        assert gone() is None, "frozen by the node's start"
    finally:
        runner.stop()
    runner.node = None
    gc.collect()
    assert broker() is None, "the stopped node's state is kept"


def test_the_counts_see_what_opened_since_the_baseline_only() -> None:
    """A socket that was open before and closes meanwhile is no change (the CI
    failure above); one opened since and left open is."""
    import socket

    earlier = socket.socketpair()
    old = Baseline(socket_inodes(), frozenset())
    ports = (1, 2, 3)  # no TCP here: what these lead to does not matter
    for s in earlier:
        s.close()
    assert sockets(ports, old.sockets) == {}
    later = socket.socketpair()
    try:
        assert sockets(ports, old.sockets) == {"not tcp": 2}
    finally:
        for s in later:
            s.close()
    assert sockets(ports, old.sockets) == {}

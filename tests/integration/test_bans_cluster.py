"""Bans shared by every node through Redis, added with `weir ban`: two real nodes
on one real Redis (and the embedded Kafka), real paho 3.1.1 and 5.0 clients.
A ban added on the command line refuses new CONNECTs on both nodes and
disconnects the covered clients connected to either; its expiry and `weir ban
del` let them in again; flapping counted on one node bans on the other."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.config import Limits
from tests.integration.conftest import Paho, node_settings
from tests.integration.test_cluster_shared import Cluster
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

BANNED = {False: "Not authorized", True: "Banned"}


def weir_ban(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services", "ban", "--redis", redis_url, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def cluster(redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str) -> Iterator[Cluster]:
    nodes = Cluster(redis_url, kafka_bootstrap, kafka_topic_prefix)
    yield nodes
    nodes.stop()


def two(cluster: Cluster, **limits: Any) -> tuple[int, int]:
    """Two nodes on the test's Redis with these limits; their MQTT ports."""
    nodes = [cluster.start(i, limits=replace(node_settings().limits, **limits)) for i in "ab"]
    return nodes[0].mqtt_port, nodes[1].mqtt_port


def connack(port: int, client_id: str, v5: bool, **kw: Any) -> str:
    c = Paho(port, client_id, v5=v5, **kw)
    try:
        return str(c.connack()[1].getName())
    finally:
        c.close()


def until_connack(port: int, client_id: str, v5: bool, expected: str, **kw: Any) -> None:
    """CONNECT until the answer is `expected` (a change that travels), within 10 s."""
    deadline = time.monotonic() + 10.0
    while (answer := connack(port, client_id, v5, **kw)) != expected:
        assert time.monotonic() < deadline, (client_id, answer, expected)


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_a_ban_added_on_the_command_line_holds_on_every_node(
    cluster: Cluster, redis_url: str, clients: list[Paho], v5: bool
) -> None:
    a, b = two(cluster)
    on_b = Paho(b, "victim", v5=v5)
    clients.append(on_b)
    assert on_b.connack()[1].getName() == "Success"
    added = weir_ban(redis_url, "add", "--clientid", "victim", "--reason", "test")
    assert added.returncode == 0, added.stderr
    rc = on_b.disconnects.get(timeout=5.0)  # node B had it connected: disconnected
    if v5:
        assert rc.value == 0x98, rc
    assert connack(a, "victim", v5) == BANNED[v5]
    assert connack(b, "victim", v5) == BANNED[v5]
    assert connack(a, "someone-else", v5) == "Success"
    listed = weir_ban(redis_url, "list")
    assert listed.returncode == 0 and "clientid victim until never by admin (test)" in listed.stdout
    lifted = weir_ban(redis_url, "del", "--clientid", "victim")
    assert lifted.returncode == 0, lifted.stderr
    until_connack(a, "victim", v5, "Success")
    until_connack(b, "victim", v5, "Success")
    assert weir_ban(redis_url, "del", "--clientid", "victim").returncode == 1


def test_user_and_address_bans_and_their_expiry(
    cluster: Cluster, redis_url: str, clients: list[Paho]
) -> None:
    a, b = two(cluster)
    user = Paho(a, "u1", v5=True, username="mallory", password="x")
    clients.append(user)
    user.connack()
    assert weir_ban(redis_url, "add", "--username", "mallory", "--until", "2s").returncode == 0
    assert user.disconnects.get(timeout=5.0).value == 0x98
    assert connack(b, "u2", True, username="mallory", password="x") == "Banned"
    until_connack(b, "u2", True, "Success", username="mallory", password="x")  # expired
    assert weir_ban(redis_url, "add", "--peerhost", "127.0.0.0/8", "--until", "2s").returncode == 0
    assert connack(a, "anyone", False) == "Not authorized"
    assert connack(b, "anyone", True) == "Banned"
    until_connack(a, "anyone", True, "Success")
    assert weir_ban(redis_url, "list").stdout == ""  # expired bans are gone from Redis


def test_flapping_counted_across_nodes_bans_everywhere(cluster: Cluster) -> None:
    """rate_storage = redis: connects on either node count in one window; the
    third within it is refused and bans the client id on both nodes."""
    a, b = two(cluster, flapping=True, flapping_max_connects=2, rate_storage="redis")
    assert connack(a, "flap", True) == "Success"
    assert connack(b, "flap", True) == "Success"
    assert connack(a, "flap", True) == "Banned"
    bans = cluster.nodes["b"].node.services.seams.admission.bans
    wait_until(lambda: bans.match("flap", None, "127.0.0.1:1") is not None, "the ban on B")
    assert connack(b, "flap", False) == "Not authorized"


@pytest.mark.parametrize(
    "args",
    [
        ("add", "--clientid", "x", "--until", "yesterday"),
        ("add", "--clientid", "x", "--until", "2001-01-01T00:00:00Z"),
        ("add", "--peerhost", "300.1.1.1"),
        ("add",),
        ("frobnicate",),
    ],
)
def test_weir_ban_bad_usage_is_one_line_exit_2(redis_url: str, args: tuple[str, ...]) -> None:
    result = weir_ban(redis_url, *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_weir_ban_without_redis_is_one_line_exit_1(tmp_path: Path) -> None:
    """No --redis and no `weir up` on the data dir to find it from: a start
    failure (exit 1, as an unreachable Redis), one line naming --redis."""
    result = subprocess.run(
        [sys.executable, "-m", "services", "ban", "--data-dir", str(tmp_path), "list"],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1 and "--redis" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_limits_defaults_are_off() -> None:
    limits = Limits()
    assert (limits.flapping, limits.max_conn_rate, limits.client_msg_rate) == (False, None, None)


def test_a_ban_whose_message_was_missed_arrives_by_the_poll(
    cluster: Cluster, redis_url: str, clients: list[Paho]
) -> None:
    """A ban written to the hash with no message on the channel (as if a node's
    subscription was reconnecting when it went out) is applied by the next
    read of the hash: within POLL_S, and it disconnects the covered client."""
    import redis

    from services.auth.banned import KEY, POLL_S, Ban

    a, _ = two(cluster)
    victim = Paho(a, "missed", v5=True)
    clients.append(victim)
    victim.connack()
    began = time.monotonic()
    with redis.Redis.from_url(redis_url) as client:
        client.hset(KEY, "clientid:missed", Ban("clientid", "missed").to_json())
    assert victim.disconnects.get(timeout=POLL_S + 5.0).value == 0x98
    assert time.monotonic() - began <= POLL_S + 1.0
    assert connack(a, "missed", True) == "Banned"


def test_a_connection_rate_counted_in_redis_holds_for_the_cluster(cluster: Cluster) -> None:
    """rate_storage = redis: one window per listener name for every node."""
    a, b = two(cluster, max_conn_rate="3/minute", rate_storage="redis")
    assert [connack(port, f"r{i}", True) for i, port in enumerate((a, b, a))] == ["Success"] * 3
    assert connack(b, "r3", True) == "Connection rate exceeded"
    assert connack(a, "r4", False) == "Server unavailable"


def test_a_rate_redis_cannot_count_lets_the_connect_in(cluster: Cluster, redis_url: str) -> None:
    """Redis writes paused past the 2 s bound of a count: the CONNECT over the
    exhausted rate is let in (logged), not refused and not held for the pause."""
    import redis

    from services.auth.limits import CALL_S

    a, _ = two(cluster, max_conn_rate="1/minute", rate_storage="redis")
    assert connack(a, "first", True) == "Success"
    assert connack(a, "second", True) == "Connection rate exceeded"
    with redis.Redis.from_url(redis_url) as admin:
        admin.execute_command("CLIENT", "PAUSE", int(CALL_S * 2000), "WRITE")
        try:
            began = time.monotonic()
            assert connack(a, "third", True) == "Success"
            assert CALL_S - 0.1 <= time.monotonic() - began < 2 * CALL_S
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")

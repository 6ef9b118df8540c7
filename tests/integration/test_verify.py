"""The drift check, `weir streams verify`, on a real node, Redis, Kafka and Spark job.

Two nodes (tests/support/backend_node.py) take a small workload: persistent
clients of both protocol versions with subscription options, a clean
client that stays online, retained messages set and cleared, a persistent
client on the second node that goes offline (so routes count on both). The
state store is then filled by the real state-store job (`weir streams run
state --available-now`, a local Spark) or, where the streaming source is
not there, by its fold and writer over the log's records. The store, the
replay and both nodes then agree, and verify exits 0.

Then each copy is corrupted in turn, and put back: a subscription taken
out of the store, a retained message changed in the store, a route count
changed in the store, the store's offsets set back, a subscription dropped
from a node's view, an entry dropped from a node's routing trie. Each time verify exits 1 and names
exactly that difference. A node that does not answer is reported; bad
arguments and unreachable backends exit 2 with one line.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from services.admin.verify import main as verify_main
from services.broker.logstate import sub_options
from services.config.redisurl import connect_sync
from services.ports import free_port
from services.state.keys import state_keys
from tests.integration.conftest import Paho
from tests.support.backend_node import BackendNode, backend_settings, start_node
from tests.support.childenv import weir_env
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.timeout(600)]

STORE_JOB_S = 240.0  # a local Spark starts in 5-15 s here; the fold of a few events is quick


@dataclass
class Cluster:
    redis_url: str
    bootstrap: str
    prefix: str
    node: BackendNode  # n1; n2 holds p2's session
    other: BackendNode
    clients: list[Paho]

    def args(self, *more: str) -> list[str]:
        return [
            "--redis",
            self.redis_url,
            "--kafka",
            self.bootstrap,
            "--topic-prefix",
            self.prefix,
            *more,
        ]

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)


def verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    """(exit code, stdout lines, stderr) of verify run in this process."""
    code = verify_main(list(args))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def workload(port: int, other_port: int) -> list[Paho]:
    p1 = Paho(port, "p1", v5=True, clean=False, session_expiry=300)
    p2 = Paho(other_port, "p2", clean=False)
    c1 = Paho(port, "c1")
    for client in (p1, p2, c1):
        assert int(getattr(rc := client.connack()[1], "value", rc)) == 0
    p1.subscribe("a/#", 1, noLocal=True, retainAsPublished=True, retainHandling=1)
    p1.subscribe("x/y", 2)
    p2.subscribe("a/b", 0)
    p2.subscribe("$share/g/a/+", 1)
    c1.subscribe("t/#", 1)
    c1.publish("r/1", b"one", qos=1, retain=True)
    c1.publish("r/2", b"two", qos=1, retain=True)
    c1.publish("r/2", b"", qos=1, retain=True)  # cleared
    p2.close()
    return [p1, c1]


def settled(node: BackendNode) -> bool:
    def read() -> bool:
        view = node.node.broker.logstate.view
        p2 = view.session("p2")
        return (
            p2 is not None
            and not p2.online
            and p2.node == "n2"
            and view.retained("r/1") is not None
            and view.retained("r/2") is None
            and len(view.all_subscriptions().get("p1", {})) == 2
            and "t/#" in view.subscriptions("c1")
        )

    done: bool = node.call(read)
    return done


def fill_store(redis_url: str, bootstrap: str, prefix: str, data_dir: Path) -> None:
    """Fold the whole log into the state store with the real job's code."""
    if importlib.util.find_spec("streams.source") is None:
        fold_log(redis_url, bootstrap, prefix)
        return
    env = weir_env()
    env["PYSPARK_PYTHON"] = sys.executable
    job = subprocess.run(
        [
            *(sys.executable, "-m", "services", "streams", "run", "state", "--available-now"),
            *("--kafka", bootstrap, "--redis", redis_url, "--kafka-topic-prefix", prefix),
            *("--data-dir", str(data_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=STORE_JOB_S,
        env=env,
        check=False,
    )
    assert job.returncode == 0, job.stderr[-3000:]


def fold_log(redis_url: str, bootstrap: str, prefix: str) -> None:
    """The job's fold and writer over the log's records, in one batch."""
    from confluent_kafka import Consumer, TopicPartition

    from services.event.schema import TOPIC_SUFFIXES
    from streams.events import as_raw_rows, parse, raw_schema
    from streams.spark import session
    from streams.statestore import StateWriter, collect, fold

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "weir-test-fold",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    records: list[tuple[str, int, int, bytes]] = []
    try:
        parts = []
        for suffix in TOPIC_SUFFIXES:
            meta = consumer.list_topics(prefix + suffix, timeout=10).topics[prefix + suffix]
            parts += [TopicPartition(prefix + suffix, p, 0) for p in meta.partitions]
        consumer.assign(parts)
        pending = {(tp.topic, tp.partition) for tp in parts}
        while pending:
            for msg in consumer.consume(100, 1.0):
                topic, partition = msg.topic(), msg.partition()
                if msg.error() is not None:
                    pending.discard((topic, partition))
                else:
                    suffix = topic.removeprefix(prefix)
                    records.append((suffix, partition, msg.offset(), msg.value()))
    finally:
        consumer.close()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session("weir-test-fold")
    try:
        raw = spark.createDataFrame(as_raw_rows(list(records), prefix), raw_schema())
        StateWriter(connect_sync(redis_url, 10.0), prefix).write(
            collect(fold(parse(raw, prefix))), 0
        )
    finally:
        spark.stop()


@contextlib.contextmanager
def agreeing(redis_url: str, bootstrap: str, spark_dir: Path) -> Iterator[Cluster]:
    """Two nodes n1 and n2 on `redis_url` (one Redis or a cluster) that took
    the workload, and the state store filled from the log: all copies agree."""
    prefix = f"t{uuid.uuid4().hex[:12]}."
    node = start_node(backend_settings(redis_url, bootstrap, prefix, "n1"))
    other = start_node(backend_settings(redis_url, bootstrap, prefix, "n2"))
    clients: list[Paho] = []
    try:
        clients = workload(node.mqtt_port, other.mqtt_port)
        for each in (node, other):
            wait_until(lambda: settled(each), "the workload in both nodes' views")  # noqa: B023
        fill_store(redis_url, bootstrap, prefix, spark_dir)
        yield Cluster(redis_url, bootstrap, prefix, node, other, clients)
    finally:
        for client in clients:
            client.close()
        other.stop()
        node.stop()


@pytest.fixture(scope="module")
def cluster(
    _redis_service_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with redis.Redis.from_url(_redis_service_url) as client:
        client.flushdb()
    with agreeing(_redis_service_url, kafka_bootstrap, tmp_path_factory.mktemp("spark")) as up:
        yield up


def test_agreeing_copies_give_no_difference_and_exit_0(cluster: Cluster) -> None:
    env = weir_env()
    result = subprocess.run(
        [sys.executable, "-m", "services", "streams", "verify", *cluster.args()],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [progress] = result.stderr.splitlines()  # not a terminal: one plain progress line
    assert re.fullmatch(r"weir streams verify: replayed [\d,]+ events in [\d.]+ s", progress)
    lines = result.stdout.splitlines()
    assert len(lines) == 1, lines
    assert "no differences" in lines[0] and "2 live nodes (n1, n2)" in lines[0], lines
    with cluster.redis() as client:  # routes count on both nodes
        routes = client.hkeys(state_keys(cluster.prefix)["routes"])
    assert {r.split(b"\0")[1] for r in routes} == {b"n1", b"n2"}


def test_a_subscription_missing_from_the_store_is_named(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    key = state_keys(cluster.prefix)["subs"]
    with cluster.redis() as client:
        held = client.hget(key, "p2")
        assert held is not None, "one field per client: p2's subscriptions"
        subs = json.loads(held)
        assert "a/b" in subs
        client.hset(key, "p2", json.dumps({f: v for f, v in subs.items() if f != "a/b"}))
        try:
            code, lines, _ = verify(capsys, *cluster.args())
        finally:
            client.hset(key, "p2", held)
    assert code == 1
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        "state store: subscription 'p2' 'a/b': missing; the log has no_local=False qos=0 "
        "retain_as_published=False retain_handling=0 subscription_id=None version="
    )
    assert "1 difference (state store 1)" in lines[-1]
    assert verify(capsys, *cluster.args())[0] == 0  # put back: no difference


def test_a_changed_retained_message_in_the_store_is_named(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    key = state_keys(cluster.prefix)["retained"]
    with cluster.redis() as client:
        held = client.hget(key, "r/1")
        assert held is not None
        doc = json.loads(held)
        doc["payload"] = base64.b64encode(b"tampered").decode()
        client.hset(key, "r/1", json.dumps(doc))
        try:
            code, lines, _ = verify(capsys, *cluster.args())
        finally:
            client.hset(key, "r/1", held)
    assert code == 1
    assert len(lines) == 2, lines
    assert lines[0].startswith("state store: retained 'r/1': payload store='blake2b:")
    assert lines[0].endswith(", size store=8 log=3")
    assert "1 difference (state store 1)" in lines[1]


def test_a_wrong_route_count_in_the_store_is_named(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    key, field = state_keys(cluster.prefix)["routes"], "a/b\0n2"
    with cluster.redis() as client:
        assert client.hget(key, field) == b"1"
        client.hincrby(key, field, 1)
        try:
            code, lines, _ = verify(capsys, *cluster.args())
        finally:
            client.hincrby(key, field, -1)
    assert code == 1
    assert lines[:-1] == ["state store: route 'a/b' on node 'n2': store 2 subscriptions, log 1"]


def test_a_store_behind_the_log_is_reported(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    key = state_keys(cluster.prefix)["offsets"]
    with cluster.redis() as client:
        field = sorted(client.hkeys(key))[0]
        client.hincrby(key, field, -1)
        try:
            code, lines, _ = verify(capsys, *cluster.args("--timeout", "1.5"))
        finally:
            client.hincrby(key, field, 1)
    assert code == 1
    assert lines[:-1] == ["state store: lags the log by 1 record"]


def test_a_subscription_missing_from_a_node_is_named(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.node

    def drop() -> Any:  # the view alone, as a bug could: the trie keeps the route
        return node.node.broker.logstate.view._subs["p1"].live.pop("x/y")

    held = node.call(drop)
    try:
        code, lines, _ = verify(capsys, *cluster.args())
    finally:
        node.call(lambda: node.node.broker.logstate.view._subs["p1"].live.update({"x/y": held}))
    assert code == 1
    assert len(lines) == 2, lines
    assert lines[0].startswith("node n1: subscription 'p1' 'x/y': missing; the log has ")
    assert "qos=2" in lines[0]
    assert "1 difference (node n1 1)" in lines[1]


def test_a_route_missing_from_a_node_trie_is_named(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.node
    trie = node.call(lambda: node.node.broker.trie)
    node.call(lambda: trie.remove("t/#", "c1"))
    try:
        code, lines, _ = verify(capsys, *cluster.args())
    finally:
        view = node.call(lambda: node.node.broker.logstate.view)
        opts = sub_options(node.call(lambda: view.subscriptions("c1"))["t/#"])
        node.call(lambda: trie.add("t/#", "c1", opts))
    assert code == 1
    assert lines[:-1] == [
        "node n1: routing table 'c1' 't/#': missing; the log has that subscription"
    ]


def test_a_node_that_does_not_answer_is_reported(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with cluster.redis() as client:
        client.set("weir:node:ghost", "127.0.0.1:1", px=60_000)  # alive, never answers
        try:
            code, lines, _ = verify(capsys, *cluster.args("--timeout", "2"))
        finally:
            client.delete("weir:node:ghost")
    assert code == 1
    assert lines[:-1] == ["node ghost: did not answer within 2 s"]
    assert "3 live nodes (ghost, n1, n2)" in lines[-1]


def run_weir(*args: str) -> subprocess.CompletedProcess[str]:
    env = weir_env()
    return subprocess.run(
        [sys.executable, "-m", "services", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--data-dir", "/nonexistent/weir"), "no weir up is running on data dir"),
        (("--redis", "redis://127.0.0.1:1/0"), "needs the cluster's Redis and Kafka"),
        (("--timeout", "0"), "0.0 is not in the range x>0"),
        (("--bogus",), "No such option '--bogus'"),
        (("--redis", "http://x", "--kafka", "h:1"), "expected a redis:// URL"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: tuple[str, ...], says: str) -> None:
    result = run_weir("streams", "verify", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


def test_unreachable_redis_or_kafka_exit_2_with_one_line(
    redis_url: str, kafka_bootstrap: str
) -> None:
    closed = free_port()
    for args, says in [
        (("--redis", f"redis://127.0.0.1:{closed}/0", "--kafka", kafka_bootstrap), "Redis"),
        (("--redis", redis_url, "--kafka", f"127.0.0.1:{closed}"), "cannot reach Kafka"),
        (("--redis", redis_url, "--kafka", kafka_bootstrap, "--topic-prefix", "none."), "none."),
    ]:
        result = run_weir("streams", "verify", *args)
        assert result.returncode == 2, result
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and says in lines[0], result.stderr
        assert "Traceback" not in result.stderr


def test_streams_without_a_subcommand_is_a_usage_error() -> None:
    result = run_weir("streams")
    assert result.returncode == 2
    assert "weir streams verify" in result.stderr

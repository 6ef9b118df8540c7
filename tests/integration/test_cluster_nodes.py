"""Two `weir up` nodes, each its own process, on one Redis and one Kafka.

Clients are paho-mqtt over real sockets. Cross-node state (subscriptions,
the session directory) travels through the Kafka log, which takes a few
hundred ms here, so tests wait for it by retrying with a deadline.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from services.ports import free_port
from tests.integration.conftest import Paho

pytestmark = [pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
PROPAGATION_S = 15.0  # Kafka tail + membership poll, with a busy machine's margin
SESSION_TAKEN_OVER = 142


class NodeProc:
    def __init__(
        self, node_id: str, redis_url: str, kafka: str, prefix: str, tmp: Path,
        extra: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self.port = free_port()
        self.log = tmp / f"{node_id}.log"
        args = [
            sys.executable, "-m", "services", "up",
            "--node-id", node_id, "--host", "127.0.0.1",
            "--mqtt-port", str(self.port), "--ws-port", "0",
            "--redis", redis_url, "--kafka", kafka, "--kafka-topic-prefix", prefix,
            "--data-dir", str(tmp / node_id), *extra,
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"ready" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"node {node_id} did not start:\n{self.log.read_text()}")
            time.sleep(0.05)  # polling a subprocess's log for its ready line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def node_pair(
    redis_url: str, kafka: str, prefix: str, tmp: Path, extra: Sequence[str] = ()
) -> Iterator[tuple[NodeProc, NodeProc]]:
    """node-a and node-b, each a `weir up` process, stopped afterwards."""
    a = NodeProc("node-a", redis_url, kafka, prefix, tmp, extra)
    try:
        b = NodeProc("node-b", redis_url, kafka, prefix, tmp, extra)
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def two_nodes(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[NodeProc, NodeProc]]:
    with node_pair(redis_url, kafka_bootstrap, kafka_topic_prefix, tmp_path) as pair:
        yield pair


@pytest.fixture
def paho() -> Iterator[list[Paho]]:
    made: list[Paho] = []
    yield made
    for c in made:
        with contextlib.suppress(Exception):
            c.close()


def until_delivered(pub: Paho, sub: Paho, topic: str, qos: int) -> bytes:
    """Publish probes until one reaches `sub` (subscription and link propagated)."""
    deadline = time.monotonic() + PROPAGATION_S
    n = 0
    while time.monotonic() < deadline:
        n += 1
        pub.publish(topic, b"probe-%d" % n, qos)
        try:
            payload: bytes = sub.message(timeout=0.3).payload
            return payload
        except queue.Empty:
            continue
    raise AssertionError(f"nothing reached the subscriber across nodes after {n} probes")


def drain(sub: Paho) -> None:
    while not sub.no_message(within=0.5):
        pass


@pytest.mark.parametrize("v5", [False, True])
def test_subscriber_on_b_gets_qos0_and_qos1_from_a(
    two_nodes: tuple[NodeProc, NodeProc], paho: list[Paho], v5: bool
) -> None:
    a, b = two_nodes
    sub = Paho(b.port, "sub-on-b", v5=v5)
    paho.append(sub)
    sub.connack()
    sub.subscribe("x/#", 1)
    pub = Paho(a.port, "pub-on-a", v5=v5)
    paho.append(pub)
    pub.connack()
    assert until_delivered(pub, sub, "x/probe", 0).startswith(b"probe-")
    drain(sub)
    pub.publish("x/zero", b"q0", 0)
    pub.publish("x/one", b"q1", 1)
    got = {}
    for _ in range(2):
        m = sub.message(timeout=5.0)
        got[m.topic] = (m.payload, m.qos)
    assert got == {"x/zero": (b"q0", 0), "x/one": (b"q1", 1)}
    assert sub.before_barrier(pub, "x/barrier", 1) == []


def test_persistent_session_moves_from_a_to_b(
    two_nodes: tuple[NodeProc, NodeProc], paho: list[Paho]
) -> None:
    a, b = two_nodes
    first = Paho(a.port, "mover", v5=True, clean=False, session_expiry=300)
    paho.append(first)
    first.connack()
    first.subscribe("m/#", 1)
    pub = Paho(a.port, "pub-m", v5=True)
    paho.append(pub)
    pub.connack()
    assert until_delivered(pub, first, "m/probe", 1).startswith(b"probe-")
    drain(first)
    second = Paho(b.port, "mover", v5=True, clean=False, session_expiry=300)
    paho.append(second)
    flags, _ = second.connack()
    assert flags.session_present, "B resumed the session from Redis"
    assert first.disconnects.get(timeout=PROPAGATION_S) == SESSION_TAKEN_OVER
    pub.publish("m/after", b"moved", 1)
    m = second.message(timeout=PROPAGATION_S)
    assert (m.topic, m.payload, m.qos) == ("m/after", b"moved", 1)

"""Node death: a survivor takes over the dead node's sessions and wills (DESIGN 5).

Two `weir up` processes on one Redis and Kafka with a 1.5 s membership TTL;
node A is SIGKILLed with clients on it. The survivor B must publish every
will A held exactly once (will delay included), end A's connections in
Redis (epoch + 1) and in the log (SessionClosed "nodedown"), and let its
persistent clients resume on B with their queued messages. And a takeover
across live nodes must not publish a delayed will at once.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.event.schema import SessionClosed
from tests.integration.conftest import Paho
from tests.integration.test_cluster_nodes import NodeProc, drain, node_pair, until_delivered
from tests.support.eventlog import log_events
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

TTL = ["--cluster-ttl", "1.5"]
TAKEOVER_S = 20.0  # TTL + one poll + the takeover itself, with a busy machine's margin


@pytest.fixture
def nodes(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[NodeProc, NodeProc]]:
    with node_pair(redis_url, kafka_bootstrap, kafka_topic_prefix, tmp_path, TTL) as pair:
        yield pair


def connect(made: list[Paho], port: int, client_id: str, **kw: object) -> Paho:
    c = Paho(port, client_id, **kw)  # type: ignore[arg-type]
    made.append(c)
    flags, rc = c.connack()
    assert rc == 0, rc
    c.session_present = flags.session_present  # type: ignore[attr-defined]
    return c


def wills_until(watcher: Paho, want: set[str], timeout_s: float = TAKEOVER_S) -> list[str]:
    """The will topics `watcher` gets until every topic in `want` came."""
    got: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not want <= set(got):
        try:
            got.append(watcher.message(timeout=max(0.1, deadline - time.monotonic())).topic)
        except queue.Empty:
            raise AssertionError(f"wills missing: {sorted(want - set(got))}, got {got}") from None
    return got


def kill(node: NodeProc) -> None:
    node.proc.kill()
    node.proc.wait()


def test_survivor_publishes_wills_and_resumes_sessions(
    nodes: tuple[NodeProc, NodeProc], clients: list[Paho], kafka_bootstrap: str,
    kafka_topic_prefix: str, redis_url: str,
) -> None:  # fmt: skip
    a, b = nodes
    watcher = connect(clients, b.port, "watcher", v5=True)
    watcher.subscribe("will/#", 1)
    watcher.subscribe("bar/#", 1)
    pub = connect(clients, b.port, "pub", v5=True)
    # On A: a persistent 5.0 session and a clean 3.1.1 one, each with a will.
    durable = connect(
        clients, a.port, "durable", v5=True, clean=False, session_expiry=300,
        will=("will/durable", b"durable gone", 1),
    )  # fmt: skip
    durable.subscribe("t/durable", 1)
    clean = connect(clients, a.port, "clean311", will=("will/clean", b"clean gone", 1))
    clean.subscribe("t/clean", 0)
    until_delivered(pub, durable, "t/durable", 1)  # B routes to both: the log got there
    until_delivered(pub, clean, "t/clean", 0)
    drain(durable)
    r = redis.Redis.from_url(redis_url)
    epoch_on_a = int(r.hget("{c:durable}:s", "epoch") or 0)

    kill(a)
    got = wills_until(watcher, {"will/durable", "will/clean"})
    assert sorted(got) == ["will/clean", "will/durable"]
    assert watcher.before_barrier(pub, "bar/1", 1) == []  # each exactly once

    # The persistent session is offline under a new epoch: a late write of A fails.
    # (A survivor sends the wills first, then adopts the sessions: wait for it.)
    wait_until(lambda: r.hget("{c:durable}:s", "online") == b"0", "durable adopted", 30.0)
    assert int(r.hget("{c:durable}:s", "epoch") or 0) > epoch_on_a
    # Its queue fills while it is away, and it resumes on B with what was queued.
    pub.publish("t/durable", b"while away", 1)
    back = connect(clients, b.port, "durable", v5=True, clean=False, session_expiry=300)
    assert back.session_present
    assert back.message(timeout=10.0).payload == b"while away"

    closed = {
        e.client_id: e
        for e in log_events(kafka_bootstrap, kafka_topic_prefix)
        if isinstance(e, SessionClosed) and e.reason == "nodedown"
    }
    assert set(closed) == {"durable", "clean311"}
    assert all(e.node == "node-b" for e in closed.values())
    assert (closed["durable"].expiry_s, closed["clean311"].expiry_s) == (300, 0)


def test_will_delay_survives_node_death(
    nodes: tuple[NodeProc, NodeProc], clients: list[Paho], redis_url: str
) -> None:
    a, b = nodes
    watcher = connect(clients, b.port, "watcher", v5=True)
    watcher.subscribe("will/#", 1)
    watcher.subscribe("bar/#", 1)
    pub = connect(clients, b.port, "pub", v5=True)
    v5 = {"v5": True, "clean": False, "session_expiry": 60}
    connect(clients, a.port, "marker", **v5, will=("will/marker", b"m", 1))
    connect(clients, a.port, "resumes", **v5, will=("will/resumes", b"r", 1), will_delay=30)
    connect(clients, a.port, "restarts", **v5, will=("will/restarts", b"s", 1), will_delay=30)
    r = redis.Redis.from_url(redis_url)
    assert r.hget("{c:resumes}:w", "n") == b"node-a"  # stored before CONNACK

    kill(a)
    assert wills_until(watcher, {"will/marker"}) == ["will/marker"]  # B took over
    # Resumed within its will delay: that will is never sent. A clean start
    # ends the old session: its will goes at once, not 30 s later.
    resumed = connect(clients, b.port, "resumes", **v5)
    assert resumed.session_present
    connect(clients, b.port, "restarts", v5=True, clean=True, session_expiry=60)
    assert wills_until(watcher, {"will/restarts"}, timeout_s=10.0) == ["will/restarts"]
    assert watcher.before_barrier(pub, "bar/2", 1) == []
    assert not r.exists("{c:resumes}:w")  # nobody holds it: it can never go out


def test_takeover_across_live_nodes_keeps_a_delayed_will(
    nodes: tuple[NodeProc, NodeProc], clients: list[Paho]
) -> None:
    a, b = nodes
    watcher = connect(clients, b.port, "watcher", v5=True)
    watcher.subscribe("will/#", 1)
    watcher.subscribe("bar/#", 1)
    pub = connect(clients, a.port, "pub", v5=True)
    until_delivered(pub, watcher, "bar/probe", 1)  # A routes to the watcher on B
    drain(watcher)
    v5 = {"v5": True, "clean": False, "session_expiry": 60}
    first = connect(clients, a.port, "mover", **v5, will=("will/mover", b"w", 1), will_delay=30)
    second = connect(clients, b.port, "mover", **v5)
    assert second.session_present
    first.disconnects.get(timeout=10.0)  # A closed the old connection
    early = watcher.before_barrier(pub, "bar/3", 1)
    assert [(m.topic, m.payload) for m in early] == []  # not at once, and never: resumed
    # Without a delay, a takeover publishes the old connection's will once.
    plain_on_a = connect(clients, a.port, "plain", will=("will/plain", b"p", 1))
    connect(clients, b.port, "plain")
    plain_on_a.disconnects.get(timeout=10.0)  # one connection per client id: A closed its own
    assert wills_until(watcher, {"will/plain"}, timeout_s=10.0) == ["will/plain"]
    assert watcher.before_barrier(pub, "bar/4", 1) == []

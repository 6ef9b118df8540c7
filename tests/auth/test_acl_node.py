"""The ACL enforced by a real node, with paho 3.1.1 and 5.0 clients over real
sockets: denied publishes (5.0 PUBACK / PUBREC 0x87, 3.1.1 acknowledged and
dropped), denied filters in a SUBSCRIBE (0x87 / 0x80, the others granted),
retained messages on subscribe, wills, resumed sessions, placeholders, the
built-in rules beyond loopback, and Redis rules. Each refusal is counted and
logged with the client id, user name, peer and rule."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.auth.acl import Acl
from services.broker.seams import Seams
from services.config import Listeners
from services.metrics.registry import Metrics
from services.mqtt.packets import Pubcomp, Publish, Pubrec, Pubrel
from services.ports import free_port
from tests.integration.conftest import NodeRunner, Paho, clients, node_settings, raws
from tests.integration.rawclient import V5, V311, Raw
from tests.support.childenv import weir_env
from tests.support.wait import wait_until

__all__ = ["clients", "raws"]  # fixtures shared with the integration tests

RULES = """
[[rule]]
permission = "deny"
action = "publish"
topics = ["secret/#", "w/forbidden"]

[[rule]]
permission = "deny"
action = "subscribe"
topics = ["secret/#", "a/secret"]

[[rule]]
permission = "allow"
action = "subscribe"
topics = ["users/%u/#"]

[[rule]]
permission = "deny"
action = "subscribe"
topics = ["users/#"]

[[rule]]
permission = "allow"
"""
NON_LOOPBACK = "192.0.2.2"  # this machine's eth0 address (see test_built_in_rules...)


class AclNode(NodeRunner):
    """A memory-backend node whose seams are given (to read their counters)."""

    def __init__(self, seams: Seams, host: str = "127.0.0.1") -> None:
        base = node_settings()
        super().__init__(replace(base, listeners=Listeners(host=host, mqtt_port=0, ws_port=0)))
        self.seams = seams

    async def _main(self) -> None:
        from services.node.app import build_services
        from services.node.node import Node

        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.node = Node(self.settings, replace(build_services(self.settings), seams=self.seams))
        await self.node.start()
        self._ready.set()
        await self._stop.wait()
        await self.node.stop()

    def denied(self, action: str) -> int:
        value: int = self.call(lambda: self.seams.metrics.authorization_deny[action])
        return value


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "acl.toml"
    path.write_text(RULES)
    return path


@pytest.fixture
def node(acl_file: Path) -> Iterator[AclNode]:
    runner = AclNode(Seams(authorizer=Acl(acl_file), metrics=Metrics())).start()
    try:
        yield runner
    finally:
        runner.stop()


@pytest.fixture
def paho(clients: list[Paho]) -> Callable[..., Paho]:
    def make(port: int, client_id: str, v5: bool, **kw: Any) -> Paho:
        c = Paho(port, client_id, v5=v5, **kw)
        clients.append(c)
        assert c.connack()[1].value == 0
        return c

    return make


def acks_with_codes(c: Paho) -> queue.Queue[tuple[int, int]]:
    """(mid, reason code) of every PUBACK / PUBREC-completed publish."""
    got: queue.Queue[tuple[int, int]] = queue.Queue()
    c.client.on_publish = lambda _c, _u, mid, rc, _p: got.put((mid, rc.value))
    return got


def subscribe_many(c: Paho, *filters: str) -> list[int]:
    c.client.subscribe([(f, 1) for f in filters])
    return [rc.value for rc in c.subacks.get(timeout=5.0)]


def denials(caplog: pytest.LogCaptureFixture, client_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "weir.auth" and f"client {client_id}," in r.getMessage()
    ]


@pytest.mark.parametrize("v5", [False, True])
def test_a_denied_publish_gets_0x87_on_5_and_is_dropped_on_3_1_1(
    node: AclNode,
    paho: Callable[..., Paho],
    raws: list[Raw],
    caplog: pytest.LogCaptureFixture,
    v5: bool,
) -> None:
    sub = paho(node.mqtt_port, "d-sub", v5)
    assert subscribe_many(sub, "secret/#", "open/#") == [0x87 if v5 else 0x80, 1]
    watcher = paho(node.mqtt_port, "d-watch", v5)
    watcher.client.subscribe("#", 2)  # loopback is nothing special in a file's rules
    assert [rc.value for rc in watcher.subacks.get(timeout=5.0)] == [2]
    pub = paho(node.mqtt_port, "d-pub", v5, username="pat")
    acks = acks_with_codes(pub)
    with caplog.at_level(logging.WARNING, "weir.auth"):
        for qos in (0, 1):  # QoS 2 below: paho sends PUBREL even after PUBREC 0x87
            info = pub.client.publish("secret/x", b"no %d" % qos, qos)
            mid, code = acks.get(timeout=5.0)  # QoS 0: once written
            assert (mid, code) == (info.mid, 0x87 if v5 and qos else 0), (qos, code)
        raw = Raw(node.mqtt_port, V5 if v5 else V311)
        raws.append(raw)
        assert raw.connect("d-raw", username="pat").reason_code == 0
        raw.send(Publish("secret/x", b"no 2", qos=2, packet_id=7))
        assert raw.expect(Pubrec).reason_code == (0x87 if v5 else 0)
        if not v5:  # 3.1.1: the exchange completes, the message is dropped
            raw.send(Pubrel(7))
            assert raw.expect(Pubcomp).packet_id == 7
        assert watcher.before_barrier(pub, "open/barrier", 2) == [], "nothing denied came"
    assert node.denied("publish") == 3
    lines = denials(caplog, "d-pub")
    assert len(lines) == 2, lines
    assert "user pat" in lines[0] and "peer 127.0.0.1:" in lines[0]
    assert "publish secret/x denied" in lines[0] and "acl.toml rule 1" in lines[0]
    assert pub.client.is_connected(), "a denied publish does not cost the connection"


@pytest.mark.parametrize("v5", [False, True])
def test_only_the_denied_filter_of_a_subscribe_is_refused(
    node: AclNode, paho: Callable[..., Paho], v5: bool
) -> None:
    c = paho(node.mqtt_port, "f-sub", v5, username="alice")
    refused = 0x87 if v5 else 0x80
    codes = subscribe_many(c, "a/#", "secret/x", "users/alice/#", "users/bob/#", "b/+")
    assert codes == [1, refused, 1, refused, 1]
    assert node.denied("subscribe") == 2
    pub = paho(node.mqtt_port, "f-pub", v5)
    assert c.before_barrier(pub, "b/barrier") == [], "still subscribed to what was granted"


@pytest.mark.parametrize("v5", [False, True])
def test_placeholders_do_not_widen_for_a_user_named_plus(
    node: AclNode, paho: Callable[..., Paho], v5: bool
) -> None:
    c = paho(node.mqtt_port, "inj", v5, username="+")
    refused = 0x87 if v5 else 0x80
    assert subscribe_many(c, "users/+/#", "users/#") == [refused, refused]


@pytest.mark.parametrize("v5", [False, True])
def test_a_retained_message_the_subscriber_may_not_see_is_not_delivered(
    node: AclNode, paho: Callable[..., Paho], v5: bool
) -> None:
    pub = paho(node.mqtt_port, "rt-pub", v5)
    pub.publish("a/secret", b"hidden", 1, retain=True)
    pub.publish("a/open", b"shown", 1, retain=True)
    sub = paho(node.mqtt_port, "rt-sub", v5)
    assert subscribe_many(sub, "a/#") == [1], "a/# itself is allowed"
    got = sub.before_barrier(pub, "a/barrier", 1)
    assert [(m.topic, m.payload, m.retain) for m in got] == [("a/open", b"shown", True)]
    assert node.denied("subscribe") == 1


@pytest.mark.parametrize("v5", [False, True])
def test_a_will_is_published_only_if_its_client_may(
    node: AclNode, paho: Callable[..., Paho], caplog: pytest.LogCaptureFixture, v5: bool
) -> None:
    sub = paho(node.mqtt_port, "w-sub", v5)
    assert subscribe_many(sub, "w/#") == [1]
    with caplog.at_level(logging.WARNING, "weir.auth"):
        denied = paho(node.mqtt_port, "w-denied", v5, will=("w/forbidden", b"gone", 1))
        denied.drop()
        wait_until(lambda: node.denied("publish") == 1, "the will refused")
    assert any("will w/forbidden denied" in line for line in denials(caplog, "w-denied"))
    allowed = paho(node.mqtt_port, "w-allowed", v5, will=("w/ok", b"bye", 1))
    allowed.drop()
    assert [(m.topic, m.payload) for m in [sub.message()]] == [("w/ok", b"bye")]
    pub = paho(node.mqtt_port, "w-pub", v5)
    assert sub.before_barrier(pub, "w/barrier", 1) == []


@pytest.mark.parametrize("v5", [False, True])
def test_a_resumed_session_loses_subscriptions_now_denied(
    node: AclNode, acl_file: Path, paho: Callable[..., Paho], clients: list[Paho], v5: bool
) -> None:
    persistent: dict[str, Any] = {"clean": False}
    if v5:
        persistent["session_expiry"] = 300
    first = paho(node.mqtt_port, "rs", v5, username="rick", **persistent)
    assert subscribe_many(first, "r/keep", "r/drop-later-rick") == [1, 1]
    first.close()
    acl_file.write_text(RULES.replace('"a/secret"]', '"a/secret", "r/drop-later-%u"]'))
    node.call(node.seams.reload)  # what SIGHUP does
    again = Paho(node.mqtt_port, "rs", v5=v5, username="rick", **persistent)
    clients.append(again)
    flags, code = again.connack()
    assert code.value == 0 and flags.session_present, "resumed, its subscriptions with it"
    pub = paho(node.mqtt_port, "rs-pub", v5)
    pub.publish("r/drop-later-rick", b"no longer", 1)
    got = again.before_barrier(pub, "r/keep", 1)
    assert got == [], [(m.topic, m.payload) for m in got]
    assert node.denied("subscribe") == 1


def test_the_built_in_rules_keep_sys_and_hash_to_loopback(
    paho: Callable[..., Paho],
) -> None:
    runner = AclNode(Seams(authorizer=Acl(None), metrics=Metrics()), host="0.0.0.0")
    runner.start()
    try:
        for v5 in (False, True):
            refused = 0x87 if v5 else 0x80
            remote = paho(runner.mqtt_port, f"far-{v5}", v5, host=NON_LOOPBACK)
            assert subscribe_many(remote, "$SYS/#", "#", "a/#") == [refused, refused, 1]
            local = paho(runner.mqtt_port, f"near-{v5}", v5)
            assert subscribe_many(local, "$SYS/#", "#") == [1, 1]
    finally:
        runner.stop()


@pytest.mark.redis
@pytest.mark.parametrize("v5", [False, True])
def test_redis_rules_allow_what_the_file_leaves_to_no_match(
    redis_url: str, tmp_path: Path, paho: Callable[..., Paho], v5: bool
) -> None:
    import redis

    from services.auth.aclredis import KEY_PREFIX, RedisAcl
    from services.store.redis import connect

    sync = redis.Redis.from_url(redis_url)
    sync.delete(KEY_PREFIX + "bob")
    sync.hset(KEY_PREFIX + "bob", mapping={"bob/#": "all", "feeds/+": "subscribe"})
    path = tmp_path / "acl.toml"
    path.write_text('[[rule]]\npermission = "allow"\naction = "subscribe"\ntopics = ["pub/#"]\n')
    acl = Acl(path, "deny", RedisAcl(connect(redis_url)))
    runner = AclNode(Seams(authorizer=acl, metrics=Metrics())).start()
    try:
        refused = 0x87 if v5 else 0x80
        bob = paho(runner.mqtt_port, "bob-1", v5, username="bob")
        assert subscribe_many(bob, "bob/#", "feeds/x", "pub/x", "alice/#") == [1, 1, 1, refused]
        acks = acks_with_codes(bob)
        info = bob.client.publish("feeds/x", b"not allowed", 1)
        assert acks.get(timeout=5.0) == (info.mid, 0x87 if v5 else 0)
        bob.publish("bob/inbox", b"mine", 1)
        assert bob.message().topic == "bob/inbox"
        eve = paho(runner.mqtt_port, "eve-1", v5, username="eve")
        assert subscribe_many(eve, "bob/#") == [refused]
    finally:
        runner.stop()
        sync.delete(KEY_PREFIX + "bob")
        sync.close()


def weir_up(*args: str) -> subprocess.Popen[str]:
    env = weir_env()
    return subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--backend", "memory", "--ws-port", "off",
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_a_missing_or_malformed_acl_file_stops_weir_up_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "acl.toml"
    bad.write_text('[[rule]]\npermission = "allow"\ntopics = ["a/#/b"]\n')
    for path in (bad, tmp_path / "missing.toml"):
        proc = weir_up("--mqtt-port", "0", "--acl-file", str(path))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and str(path) in err
    for args, named in ((("--acl-no-match", "maybe"), "acl_no_match"), (("--acl-redis",), "Redis")):
        proc = weir_up("--mqtt-port", "0", *args)  # (--backend memory: no Redis)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and named in err and len(err.strip().splitlines()) == 1, err


def test_sighup_rereads_the_acl_file(tmp_path: Path, clients: list[Paho]) -> None:
    path = tmp_path / "acl.toml"
    path.write_text('[[rule]]\npermission = "deny"\naction = "subscribe"\ntopics = ["x/#"]\n'
                    '[[rule]]\npermission = "allow"\n')  # fmt: skip
    port = free_port()
    proc = weir_up("--mqtt-port", str(port), "--acl-file", str(path))
    try:
        assert proc.stdout is not None
        assert "ready" in proc.stdout.readline()
        c = Paho(port, "hup", v5=True)
        clients.append(c)
        assert c.connack()[1].value == 0
        assert subscribe_many(c, "x/1") == [0x87]
        stat = path.stat()
        path.write_text('[[rule]]\npermission = "allow"\n')
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only SIGHUP can tell
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: subscribe_many(c, "x/1") == [1], "the new rules after SIGHUP")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)

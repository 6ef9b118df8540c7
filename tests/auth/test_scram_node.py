"""SCRAM-SHA-256 over MQTT 5 enhanced authentication, end to end over sockets:
`weir passwd --scram` writes the credentials (password file, Redis users), the
node built by the composition root (`services.node.app.seams_for`) runs the
exchange, the tests' own SCRAM client (tests/support/scramclient.py) logs in
through a raw socket on the project codec, and checks the server's signature.
Refusals: reason code, one log line naming scram, one count."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.auth.admission import Admission
from services.auth.banned import Ban, MemoryBans
from services.auth.redisusers import KEY_PREFIX, SCRAM_FIELD
from services.broker.seams import Kicks
from services.config.auth import AuthBackend
from services.metrics.registry import Metrics
from services.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Subscription,
    Will,
)
from services.node.app import seams_for
from tests.auth.test_password_file import weir
from tests.integration.conftest import NodeRunner, Paho, node_settings, raws
from tests.integration.rawclient import Raw
from tests.support.scramclient import METHOD, ScramClient, auth, props, scram_connect

__all__ = ["raws"]  # the fixture shared with the integration tests
V5 = 5


def passwd(*args: str, password: str) -> None:
    result = weir("passwd", *args, "--password-stdin", stdin=password + "\n")
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def passwd_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scram") / "passwd"
    passwd(str(path), "alice", "--scram", password="alice-pw")
    passwd(str(path), "bob", password="bob-pw")  # argon2 only
    return path


def test_weir_passwd_scram_writes_a_second_line_without_the_password(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    passwd(str(path), "dave", "--scram", password="dave-pw")
    text = path.read_text()
    assert [line.split(":", 1)[1][:14] for line in text.splitlines()] == [
        "$argon2id$v=19",
        "SCRAM-SHA-256$",
    ]
    assert "dave-pw" not in text
    passwd(str(path), "dave", password="new-pw")  # without --scram: the SCRAM line goes
    assert len(path.read_text().splitlines()) == 1


@contextlib.contextmanager
def scram_node(
    *auth: AuthBackend, acl: Path | None = None, redis_url: str | None = None
) -> Iterator[NodeRunner]:
    acl_file = None if acl is None else str(acl)
    settings = dataclasses.replace(node_settings(), auth=auth, acl_file=acl_file)
    client = None
    if redis_url is not None:
        from services.store.redis import connect

        client = connect(redis_url)
    metrics = Metrics()
    kicks = Kicks(metrics)  # what a ban added to the table disconnects
    seams = dataclasses.replace(
        seams_for(settings, client),
        metrics=metrics,
        admission=Admission(MemoryBans(kicks.banned)),
        kicks=kicks,
    )
    node = NodeRunner(settings, seams).start()
    try:
        yield node
    finally:
        node.stop()


def denied(node: NodeRunner) -> int:
    assert node.seams is not None
    metrics = node.seams.metrics
    count: int = node.call(lambda: metrics.authentication_failure)
    return count


@pytest.fixture(scope="module")
def node(passwd_file: Path) -> Iterator[NodeRunner]:
    with scram_node(AuthBackend("password_file", path=str(passwd_file))) as running:
        yield running


def raw(node: NodeRunner, raws: list[Raw]) -> Raw:
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    return r


def login(node: NodeRunner, raws: list[Raw], user: str, password: str, cid: str = "s1",
          **kw: object) -> tuple[Raw, Connack, ScramClient]:  # fmt: skip
    r = raw(node, raws)
    client = ScramClient(user, password)
    ack = scram_connect(r, cid, client, **kw)
    assert isinstance(ack, Connack)
    return r, ack, client


def scram_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "weir.auth" and "refused" in r.getMessage()]  # fmt: skip


def test_login_from_the_password_file(node: NodeRunner, raws: list[Raw]) -> None:
    r, ack, client = login(node, raws, "alice", "alice-pw", username="alice")
    assert ack.reason_code == 0
    assert ack.properties.authentication_method == METHOD
    assert client.verified(ack.properties.authentication_data), "the server knows the key"
    r.subscribe(Subscription("t/alice", 1))
    r.send(Publish("t/alice", b"hi", qos=1, packet_id=2))
    assert {type(r.recv()), type(r.recv())} == {Puback, Publish}


def test_the_same_user_also_logs_in_with_its_password_and_a_311_client_is_unaffected(
    node: NodeRunner,
) -> None:
    for v5 in (True, False):
        c = Paho(node.mqtt_port, f"plain-{v5}", v5=v5, username="alice", password="alice-pw")
        try:
            assert c.connack()[1].getName() == "Success"
        finally:
            c.close()


def test_refusals_are_0x86_logged_and_counted(
    node: NodeRunner, raws: list[Raw], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weir.auth")
    before = denied(node)
    assert login(node, raws, "alice", "wrong", "w1")[1].reason_code == 0x86
    assert login(node, raws, "nobody", "x", "w2")[1].reason_code == 0x86
    assert login(node, raws, "bob", "bob-pw", "w3")[1].reason_code == 0x86, "no SCRAM line"
    mismatch = login(node, raws, "alice", "alice-pw", "w4", username="bob")
    assert mismatch[1].reason_code == 0x86
    assert denied(node) == before + 4
    lines = scram_lines(caplog)
    assert len(lines) == 4
    assert lines[0].startswith("connect refused 0x86: client w1, user None, peer 127.0.0.1:")
    assert lines[0].endswith("by scram: wrong proof for 'alice'")
    assert lines[1].endswith("by scram: unknown user 'nobody'")
    assert "client w4, user bob" in lines[3] and "scram: user 'alice'" in lines[3]


def test_unsupported_method_is_0x8c_logged_and_counted(
    node: NodeRunner, raws: list[Raw], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weir.auth")
    before = denied(node)
    r = raw(node, raws)
    r.send(Connect("m1", protocol_level=V5, properties=props(b"n,,n=a,r=x", "SCRAM-SHA-1")))
    assert r.closed() == [Connack(False, 0x8C)]
    assert denied(node) == before + 1
    assert scram_lines(caplog)[-1].endswith("method 'SCRAM-SHA-1' is not supported")


def test_a_node_without_scram_store_refuses_every_method_0x8c(raws: list[Raw]) -> None:
    with scram_node(AuthBackend("jwt", secret="s" * 32)) as jwt_only:
        r = raw(jwt_only, raws)
        r.send(Connect("m2", protocol_level=V5, properties=props(b"n,,n=a,r=x")))
        assert r.closed() == [Connack(False, 0x8C)]


def test_a_client_stopping_mid_exchange_is_closed_by_the_connect_timer(
    passwd_file: Path, raws: list[Raw], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No setting names the connect timeout (10 s): the node's channel config is
    given 0.5 s here. The client sends its CONNECT and never answers the challenge."""
    import services.node.node as node_module

    built = node_module.channel_config
    monkeypatch.setattr(node_module, "channel_config", lambda *a: dataclasses.replace(
        built(*a), connect_timeout_s=0.5))  # fmt: skip
    with scram_node(AuthBackend("password_file", path=str(passwd_file))) as short:
        r = raw(short, raws)
        first = ScramClient("alice", "x").first()
        r.send(Connect("t1", protocol_level=V5, properties=props(first)))
        challenge = r.recv()
        assert isinstance(challenge, Auth) and challenge.reason_code == 0x18
        assert r.closed(timeout=3.0) == [], "closed, no CONNACK"


def test_auth_with_another_method_mid_exchange_is_0x82(node: NodeRunner, raws: list[Raw]) -> None:
    r = raw(node, raws)
    client = ScramClient("alice", "alice-pw")
    r.send(Connect("p1", protocol_level=V5, properties=props(client.first())))
    challenge = r.recv()
    assert isinstance(challenge, Auth) and challenge.reason_code == 0x18
    r.send(auth(0x18, b"c=biws", "PLAIN"))
    assert r.closed() == [Connack(False, 0x82)]


def test_auth_where_none_is_expected_is_disconnect_0x82(node: NodeRunner, raws: list[Raw]) -> None:
    r = raw(node, raws)
    assert r.connect("p2", username="bob", password=b"bob-pw").reason_code == 0
    r.send(auth(0x19, b"n,,n=bob,r=x"))
    assert r.closed() == [Disconnect(0x82)]


def test_reauthentication_while_messages_flow(node: NodeRunner, raws: list[Raw]) -> None:
    r, ack, _ = login(node, raws, "alice", "alice-pw", "r1")
    assert ack.reason_code == 0
    r.subscribe(Subscription("flow/r1", 1))
    again = ScramClient("alice", "alice-pw")
    r.send(auth(0x19, again.first()))
    challenge = r.expect(Auth)
    assert challenge.reason_code == 0x18
    r.send(Publish("flow/r1", b"mid-reauth", qos=1, packet_id=3))  # before answering
    assert {type(r.recv()), type(r.recv())} == {Puback, Publish}
    r.send(auth(0x18, again.final(challenge.properties.authentication_data)))
    done = r.expect(Auth)
    assert done.reason_code == 0x00 and done.properties.authentication_method == METHOD
    assert again.verified(done.properties.authentication_data)
    r.send(Publish("flow/r1", b"after", qos=1, packet_id=4))
    assert {type(r.recv()), type(r.recv())} == {Puback, Publish}


def test_failed_reauthentication_is_disconnect_0x87_and_the_will(
    node: NodeRunner, raws: list[Raw]
) -> None:
    watcher = raw(node, raws)
    assert watcher.connect("watcher", username="bob", password=b"bob-pw").reason_code == 0
    watcher.subscribe(Subscription("will/r2", 0))
    will = Will("will/r2", b"r2 gone")
    r, ack, _ = login(node, raws, "alice", "alice-pw", "r2", will=will)
    assert ack.reason_code == 0
    wrong = ScramClient("alice", "not-it")
    r.send(auth(0x19, wrong.first()))
    challenge = r.expect(Auth)
    r.send(auth(0x18, wrong.final(challenge.properties.authentication_data)))
    assert r.closed() == [Disconnect(0x87)]
    published = watcher.expect(Publish)
    assert published.topic == "will/r2" and published.payload == b"r2 gone"


def test_reauthentication_with_another_method_is_disconnect_0x82(
    node: NodeRunner, raws: list[Raw]
) -> None:
    r, ack, _ = login(node, raws, "alice", "alice-pw", "r3")
    assert ack.reason_code == 0
    r.send(Auth(0x19, Properties(authentication_method="OTHER", authentication_data=b"x")))
    assert r.closed() == [Disconnect(0x82)]


def test_bans_and_acl_apply_to_the_scram_user(passwd_file: Path, tmp_path: Path,
                                              raws: list[Raw]) -> None:  # fmt: skip
    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\npermission = "allow"\ntopics = ["users/%u/#"]\n')
    backend = AuthBackend("password_file", path=str(passwd_file))
    with scram_node(backend, acl=acl) as acl_node:
        assert acl_node.seams is not None and acl_node.seams.admission is not None
        bans = acl_node.seams.admission.bans
        r, ack, _ = login(acl_node, raws, "alice", "alice-pw", "a1")  # no CONNECT user name
        assert ack.reason_code == 0
        r.send(Publish("users/alice/x", b"mine", qos=1, packet_id=1))
        assert r.expect(Puback).reason_code in (0x00, 0x10)
        r.send(Publish("users/bob/x", b"not mine", qos=1, packet_id=2))
        assert r.expect(Puback).reason_code == 0x87
        assert acl_node.loop is not None
        added = asyncio.run_coroutine_threadsafe(bans.add(Ban("username", "alice")), acl_node.loop)
        added.result(5)
        assert r.closed() == [Disconnect(0x98)], "the connected SCRAM user is kicked"
        assert login(acl_node, raws, "alice", "alice-pw", "a2")[1].reason_code == 0x8A


@pytest.mark.redis
def test_login_from_redis_users(redis_url: str, raws: list[Raw]) -> None:
    passwd("--redis", redis_url, "carol", "--scram", password="carol-pw")
    stored = redis.Redis.from_url(redis_url).hget(KEY_PREFIX + "carol", SCRAM_FIELD)
    assert isinstance(stored, bytes) and stored.startswith(b"SCRAM-SHA-256$4096:")
    with scram_node(AuthBackend("redis"), redis_url=redis_url) as redis_node:
        _, ack, client = login(redis_node, raws, "carol", "carol-pw", "c1")
        assert ack.reason_code == 0 and client.verified(ack.properties.authentication_data)
        assert login(redis_node, raws, "carol", "nope", "c2")[1].reason_code == 0x86
        passwd("--redis", redis_url, "carol", password="carol-pw")  # without --scram: removed
        assert login(redis_node, raws, "carol", "carol-pw", "c3")[1].reason_code == 0x86

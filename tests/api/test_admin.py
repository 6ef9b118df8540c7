"""Users, ACL rules, plugins, listeners, the log level and drain against a
real `weir up` on its embedded Redis and Kafka, with a password file, Redis
users and a configured plugin (one node for the module; drain is last)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from services.mqtt.packets import Publish, Subscription
from tests.integration.rawclient import V5, Raw, v5_disconnect_code
from tests.support.api_node import ApiNode
from tests.support.wait import wait_until

CONFIG = """
[[plugin]]
name = "topic_rewrite"
[plugin.config]
rules = [{ filter = "x/#", from = '^x/(.+)$', to = "y/$1" }]
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    tmp = tmp_path_factory.mktemp("admin")
    (tmp / "passwd").write_text("")
    (tmp / "weir.toml").write_text(CONFIG)
    running = ApiNode(
        tmp, "--config", str(tmp / "weir.toml"), "--password-file", str(tmp / "passwd"),
        "--auth-redis", "--server-reference", "elsewhere:1883",
    )  # fmt: skip
    try:
        yield running
    finally:
        running.stop()


def ok(node: ApiNode, method: str, path: str, body: Any = None) -> Any:
    status, answer = node.call(method, path, body)
    assert 200 <= status < 300, (status, answer)
    return answer


def mqtt(node: ApiNode, cid: str, user: str, password: str) -> tuple[Raw, int]:
    r = Raw(node.mqtt_port, V5)
    return r, r.connect(cid, username=user, password=password.encode()).reason_code


@pytest.mark.parametrize("backend", ["password_file", "redis"])
def test_users_added_let_in_and_deleted(node: ApiNode, backend: str) -> None:
    user = f"u-{backend}"
    assert ok(node, "POST", f"/api/v5/authentication/{backend}/users",
              {"user_id": user, "password": "pw1"}) == {"user_id": user}  # fmt: skip
    assert node.call("POST", f"/api/v5/authentication/{backend}/users",
                     {"user_id": user, "password": "x"})[0] == 409  # fmt: skip
    listed = ok(node, "GET", f"/api/v5/authentication/{backend}/users?like_user_id=u-")
    assert [u["user_id"] for u in listed["data"]] == [user]
    r, code = mqtt(node, f"c-{backend}", user, "pw1")
    r.close()
    assert code == 0
    ok(node, "PUT", f"/api/v5/authentication/{backend}/users/{user}", {"password": "pw2"})
    wait_until(lambda: mqtt_code(node, user, "pw2") == 0, "the new password works")
    assert node.call("DELETE", f"/api/v5/authentication/{backend}/users/{user}")[0] == 204
    wait_until(lambda: mqtt_code(node, user, "pw2") == 0x86, "the user is gone")
    assert node.call("DELETE", f"/api/v5/authentication/{backend}/users/{user}")[0] == 404
    for bad in [{"user_id": "a:b", "password": "x"}, {"user_id": "a"}, {"password": "x"}]:
        assert node.call("POST", f"/api/v5/authentication/{backend}/users", bad)[0] == 400


def mqtt_code(node: ApiNode, user: str, password: str) -> int:
    r, code = mqtt(node, "probe", user, password)
    r.close()
    return code


def test_passwd_file_is_what_weir_passwd_writes(node: ApiNode) -> None:
    from services.auth.passwd import read_users

    ok(node, "POST", "/api/v5/authentication/password_file/users",
       {"user_id": "scrammy", "password": "pw", "scram": True})  # fmt: skip
    hashes, scram = read_users(node.tmp / "passwd")
    assert hashes["scrammy"].startswith("$argon2id$") and "scrammy" in scram
    assert node.call("GET", "/api/v5/authentication/jwt/users")[0] == 400


def test_acl_rules_in_redis(node: ApiNode) -> None:
    rules = [{"topic": "a/%u/#", "action": "publish"}, {"topic": "eq b/#", "action": "all"}]
    assert ok(node, "PUT", "/api/v5/authorization/redis/rules/alice", rules) == sorted(
        rules, key=lambda r: r["topic"])  # fmt: skip
    assert ok(node, "GET", "/api/v5/authorization/redis/rules/alice") == sorted(
        rules, key=lambda r: r["topic"])  # fmt: skip
    url = node.log[0].split("redis ")[1].split(",")[0]  # the ready line names the Redis
    with redis.Redis.from_url(url) as client:
        assert client.hgetall("weir:acl:alice") == {b"a/%u/#": b"publish", b"eq b/#": b"all"}
    for bad in [[{"topic": "a/#/b", "action": "all"}], [{"topic": "a", "action": "read"}], {}]:
        assert node.call("PUT", "/api/v5/authorization/redis/rules/alice", bad)[0] == 400
    assert node.call("DELETE", "/api/v5/authorization/redis/rules/alice")[0] == 204
    assert ok(node, "GET", "/api/v5/authorization/redis/rules/alice") == []
    assert node.call("DELETE", "/api/v5/authorization/redis/rules/alice")[0] == 404


def test_plugins_stop_and_start(node: ApiNode) -> None:
    ok(node, "POST", "/api/v5/authentication/redis/users", {"user_id": "pl", "password": "pw"})
    sub, code = mqtt(node, "pl-sub", "pl", "pw")
    pub, _ = mqtt(node, "pl-pub", "pl", "pw")
    try:
        assert code == 0
        sub.subscribe(Subscription("x/#", 0), Subscription("y/#", 0))
        plugins = {p["name"]: p for p in ok(node, "GET", "/api/v5/plugins")}
        assert plugins["topic_rewrite"] == {"name": "topic_rewrite", "running": True,
                                            "configured": True}  # fmt: skip
        assert plugins["webhook"]["running"] is False
        pub.send(Publish("x/1", b"a", 0))
        assert sub.expect(Publish).topic == "y/1"  # rewritten
        assert ok(node, "PUT", "/api/v5/plugins/topic_rewrite/stop")["running"] is False
        pub.send(Publish("x/2", b"b", 0))
        assert sub.expect(Publish).topic == "x/2"  # not any more
        assert node.call("PUT", "/api/v5/plugins/topic_rewrite/stop")[0] == 404
        assert ok(node, "PUT", "/api/v5/plugins/topic_rewrite/start")["running"] is True
        pub.send(Publish("x/3", b"c", 0))
        assert sub.expect(Publish).topic == "y/3"  # its configured rules again
        assert node.call("PUT", "/api/v5/plugins/topic_rewrite/start")[0] == 409
        assert node.call("PUT", "/api/v5/plugins/nope/start")[0] == 404
    finally:
        sub.close()
        pub.close()


def test_listeners_and_log_level(node: ApiNode) -> None:
    [mqtt_listener] = ok(node, "GET", "/api/v5/listeners")
    assert mqtt_listener["name"] == "mqtt" and mqtt_listener["running"] is True
    assert mqtt_listener["bind"].endswith(f":{node.mqtt_port}")
    assert ok(node, "GET", "/api/v5/log/level") == {"level": "info"}
    assert ok(node, "PUT", "/api/v5/log/level", {"level": "debug"}) == {"level": "debug"}
    assert ok(node, "GET", "/api/v5/log/level") == {"level": "debug"}
    assert node.call("PUT", "/api/v5/log/level", {"level": "loud"})[0] == 400
    ok(node, "PUT", "/api/v5/log/level", {"level": "info"})


def test_drain_is_the_sigusr1_path(node: ApiNode) -> None:
    """Last: the node stops."""
    ok(node, "POST", "/api/v5/authentication/redis/users", {"user_id": "dr", "password": "pw"})
    r, _ = mqtt(node, "drained", "dr", "pw")
    try:
        assert node.call("POST", "/api/v5/nodes/nowhere/drain")[0] == 404
        status, body = node.call("POST", f"/api/v5/nodes/{body_node(node)}/drain")
        assert status == 202 and body["draining"] is True
        assert v5_disconnect_code(r.closed()) == 0x9C
        assert node.process.wait(timeout=30) == 0
        assert any("draining: clients told to use another server" in x for x in node.log)
    finally:
        r.close()


def body_node(node: ApiNode) -> str:
    return str(ok(node, "GET", "/api/v5/status?format=json")["node_name"])

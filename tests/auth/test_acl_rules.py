"""The ACL's rules without a node: the file format, every kind of rule, the
evaluator (first match, no_match), placeholders and their injection, `eq`,
the built-in rules, reloading, and the per-connection cache."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from services.auth.acl import Acl
from services.auth.aclfile import DEFAULT_ACL, AclFileError, default_rules, parse, read
from services.auth.aclredis import parse_hash
from services.auth.aclrules import covers
from services.auth.api import Action, ClientInfo

PUB, SUB = Action.PUBLISH, Action.SUBSCRIBE


def who(
    client_id: str = "c1", username: str | None = "alice", peer: str = "192.0.2.7:4000"
) -> ClientInfo:
    return ClientInfo(client_id, username, peer, 5)


def acl_of(tmp_path: Path, text: str, no_match: str = "deny") -> Acl:
    path = tmp_path / "acl.toml"
    path.write_text(text)
    return Acl(path, no_match, reload_check_s=3600.0)


def may(
    acl: Acl, client: ClientInfo, action: Action, topic: str, qos: int = 0, retain: bool = False
) -> bool:
    return acl.allowed(client, action, topic, qos, retain)


def test_coverage_of_subscription_filters_and_topic_names() -> None:
    assert covers("a/#", "a/b/c") and covers("a/#", "a/+/b") and covers("a/#", "a/#")
    assert covers("a/#", "a") and covers("a/+", "a/+") and covers("#", "#")
    assert not covers("a/+", "a/#"), "a/# reaches deeper than a/+"
    assert not covers("a/b", "a/+"), "a/+ receives more than a/b"
    assert not covers("#", "$SYS/x") and not covers("+/x", "$SYS/x")
    assert covers("$SYS/#", "$SYS/broker/uptime")


def test_who_rules_user_client_ip_group_and_all(tmp_path: Path) -> None:
    acl = acl_of(
        tmp_path,
        """
        [groups]
        ops = ["olga", "oscar"]
        [[rule]]
        permission = "allow"
        user = "alice"
        topics = ["u/alice"]
        [[rule]]
        permission = "allow"
        client = "dev-1"
        topics = ["c/dev-1"]
        [[rule]]
        permission = "allow"
        ip = "10.1.0.0/16"
        topics = ["net/ten"]
        [[rule]]
        permission = "allow"
        ip = "2001:db8::/32"
        topics = ["net/six"]
        [[rule]]
        permission = "allow"
        group = "ops"
        topics = ["ops/#"]
        [[rule]]
        permission = "allow"
        topics = ["everyone"]
        [[rule]]
        permission = "allow"
        user = "bob"
        client = "bob-phone"
        topics = ["both"]
        """,
    )
    assert may(acl, who(username="alice"), PUB, "u/alice")
    assert not may(acl, who(username="mallory"), PUB, "u/alice")
    assert may(acl, who(client_id="dev-1"), PUB, "c/dev-1")
    assert not may(acl, who(client_id="dev-2"), PUB, "c/dev-1")
    assert may(acl, who(peer="10.1.2.3:5"), PUB, "net/ten")
    assert not may(acl, who(peer="10.2.0.1:5"), PUB, "net/ten")
    assert may(acl, who(peer="2001:db8::1:5"), PUB, "net/six")
    assert may(acl, who(peer="::ffff:10.1.0.9:5"), PUB, "net/ten"), "IPv4-mapped peer"
    assert may(acl, who(username="oscar"), SUB, "ops/deploy/#")
    assert not may(acl, who(username="alice"), SUB, "ops/deploy/#")
    assert not may(acl, who(username=None), SUB, "ops/x")
    assert may(acl, who(username=None, client_id="anyone"), PUB, "everyone")
    assert may(acl, who(username="bob", client_id="bob-phone"), PUB, "both")
    assert not may(acl, who(username="bob", client_id="bob-laptop"), PUB, "both"), "needs both"


def test_actions_first_match_and_no_match(tmp_path: Path) -> None:
    text = """
        [[rule]]
        permission = "deny"
        action = "publish"
        topics = ["a/locked"]
        [[rule]]
        permission = "allow"
        action = "publish"
        topics = ["a/#"]
        [[rule]]
        permission = "allow"
        action = "subscribe"
        topics = ["b/#"]
        """
    acl = acl_of(tmp_path, text)
    c = who()
    assert may(acl, c, PUB, "a/open") and not may(acl, c, PUB, "a/locked"), "the first match wins"
    assert not may(acl, c, SUB, "a/open"), "a publish rule says nothing about subscribing"
    assert may(acl, c, SUB, "b/+/x") and not may(acl, c, PUB, "b/x")
    assert not may(acl, c, PUB, "elsewhere"), "no_match deny"
    assert "no_match deny" in acl.rule(c, PUB, "elsewhere", 0, False)
    assert "acl.toml rule 1" in acl.rule(c, PUB, "a/locked", 0, False)
    allowing = acl_of(tmp_path, text, no_match="allow")
    assert may(allowing, c, PUB, "elsewhere") and not may(allowing, c, PUB, "a/locked")


def test_eq_names_a_filter_exactly(tmp_path: Path) -> None:
    acl = acl_of(
        tmp_path,
        """
        [[rule]]
        permission = "deny"
        action = "subscribe"
        topics = [{eq = "#"}, {eq = "a/+"}]
        [[rule]]
        permission = "allow"
        """,
    )
    c = who()
    assert not may(acl, c, SUB, "#") and not may(acl, c, SUB, "a/+")
    assert not may(acl, c, SUB, "$share/g/#"), "a shared # is still #"
    assert may(acl, c, SUB, "a/#") and may(acl, c, SUB, "a/b") and may(acl, c, SUB, "x/#")


def test_placeholders_fill_in_and_can_never_widen(tmp_path: Path) -> None:
    acl = acl_of(
        tmp_path,
        """
        [[rule]]
        permission = "allow"
        topics = ["users/%u/#", "devices/%c/state"]
        """,
    )
    assert may(acl, who(username="alice"), SUB, "users/alice/#")
    assert may(acl, who(username="alice"), PUB, "users/alice/inbox")
    assert not may(acl, who(username="alice"), PUB, "users/bob/inbox")
    assert may(acl, who(client_id="d7"), PUB, "devices/d7/state")
    assert not may(acl, who(client_id="d7"), PUB, "devices/d8/state")
    for bad in ("+", "#", "a/b", "x+", ""):
        assert not may(acl, who(username=bad), SUB, "users/+/#"), bad
        assert not may(acl, who(username=bad), PUB, "users/x/inbox"), bad
        assert not may(acl, who(client_id=bad or "#"), PUB, "devices/x/state"), bad
    assert not may(acl, who(username=None), PUB, "users/None/x")


def test_qos_and_retain_conditions(tmp_path: Path) -> None:
    acl = acl_of(
        tmp_path,
        """
        [[rule]]
        permission = "deny"
        action = "publish"
        retain = true
        [[rule]]
        permission = "allow"
        action = "publish"
        topics = ["t/#"]
        qos = [0, 1]
        [[rule]]
        permission = "allow"
        action = "subscribe"
        qos = [0]
        """,
    )
    c = who()
    assert may(acl, c, PUB, "t/x", 1) and not may(acl, c, PUB, "t/x", 2)
    assert not may(acl, c, PUB, "t/x", 0, retain=True)
    assert may(acl, c, SUB, "any/#", 0) and not may(acl, c, SUB, "any/#", 1)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[[rule]]\npermission = "maybe"\n', "rule 1: permission"),
        ('[[rule]]\npermission = "allow"\n[[rule]]\npermission = "deny"\nwho = "x"\n', "rule 2"),
        ('[[rule]]\npermission = "allow"\ntopics = ["a/#/b"]\n', "'a/#/b'"),
        ('[[rule]]\npermission = "allow"\ngroup = "ops"\n', "group 'ops'"),
        ('[[rule]]\npermission = "allow"\nqos = [3]\n', "qos"),
        ('[[rule]]\npermission = "allow"\nip = "10.0.0.300/8"\n', "ip"),
        ('[[rule]]\npermission = "allow"\naction = "read"\n', "action"),
        ('[[rule]]\npermission = "allow"\ntopics = [{exact = "#"}]\n', "eq"),
        ('[[rule]]\npermission = "allow"\ntopics = []\n', "topics"),
        ("[[rule]\n", "acl.toml"),
        ("[rules]\n", "unknown table 'rules'"),
    ],
)
def test_a_malformed_file_is_one_line_naming_the_rule(text: str, named: str) -> None:
    with pytest.raises(AclFileError) as caught:
        parse(text, "acl.toml")
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_the_built_in_rules_are_emqxs(tmp_path: Path) -> None:
    assert parse(DEFAULT_ACL, "built-in ACL") == default_rules()
    acl = Acl(None)
    assert not acl.publish_checked, "the built-in rules never refuse a publish"
    for local in ("127.0.0.1:5", "::1:5"):
        assert may(acl, who(peer=local), SUB, "$SYS/#") and may(acl, who(peer=local), SUB, "#")
    remote = who(peer="192.0.2.9:5")
    assert not may(acl, remote, SUB, "$SYS/#") and not may(acl, remote, SUB, "$SYS/brokers")
    assert not may(acl, remote, SUB, "#")
    assert may(acl, remote, SUB, "a/#") and may(acl, remote, SUB, "+/b")
    assert may(acl, remote, PUB, "$SYS/anything") and may(acl, remote, PUB, "a/b", 2, True)
    with_admin = acl_of(tmp_path, DEFAULT_ACL.replace("admin = []", 'admin = ["root"]'))
    assert may(with_admin, who(username="root", peer="192.0.2.9:5"), SUB, "$SYS/#")
    assert not may(with_admin, who(username="root", peer="192.0.2.9:5"), SUB, "#")
    assert len(default_rules(final_allow=False)) == len(default_rules()) - 1


def test_an_empty_file_denies_everything(tmp_path: Path) -> None:
    acl = acl_of(tmp_path, "# nothing yet\n", no_match="allow")
    assert acl.publish_checked
    assert not may(acl, who(peer="127.0.0.1:1"), PUB, "a") and not may(acl, who(), SUB, "a")
    assert "denies everything" in acl.rule(who(), SUB, "a", 0, False)


def test_reload_on_change_and_sighup_bad_keeps_unreadable_denies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "acl.toml"
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["one"]\n')
    acl = Acl(path, reload_check_s=0.0)
    c = who()
    asyncio.run(acl.connected(c))
    assert may(acl, c, PUB, "one") and not may(acl, c, PUB, "two")
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["two"]\n')
    os.utime(path, (1, 1))  # a new modification time, whatever the clock's resolution
    assert may(acl, c, PUB, "two") and not may(acl, c, PUB, "one"), "cached answers dropped"
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["a/#/b"]\n')
    os.utime(path, (2, 2))
    with caplog.at_level(logging.WARNING, "weir.auth"):
        assert may(acl, c, PUB, "two"), "a malformed file keeps the rules read before"
    assert [r.getMessage() for r in caplog.records if "keeping the 1 rules" in r.getMessage()]
    path.unlink()
    assert not may(acl, c, PUB, "two"), "an unreadable file denies everything"
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["three"]\n')
    os.utime(path, (3, 3))
    assert may(acl, c, PUB, "three")
    slow = Acl(path, reload_check_s=3600.0)  # only SIGHUP (reload) reads it again
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["four"]\n')
    assert not may(slow, c, PUB, "four")
    assert slow.reload() and may(slow, c, PUB, "four")


def test_answers_are_cached_per_connection_until_reload(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["x"]\n')
    acl = Acl(path, reload_check_s=3600.0)
    c = who()
    asyncio.run(acl.connected(c))
    assert may(acl, c, PUB, "x")
    acl.rules = ()  # were the cache not used, "x" would now fall to no_match
    assert may(acl, c, PUB, "x")
    assert not may(acl, who(client_id="other"), PUB, "x"), "another connection, no cache"
    path.write_text('[[rule]]\npermission = "deny"\n')
    assert acl.reload() and not may(acl, c, PUB, "x")
    path.write_text('[[rule]]\npermission = "allow"\ntopics = ["x"]\n')
    assert acl.reload() and may(acl, c, PUB, "x")
    acl.disconnected(c)
    assert c not in acl._connections
    acl.rules = ()
    assert not may(acl, c, PUB, "x"), "its cache went with its connection"


def test_read_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AclFileError, match=r"missing\.toml"):
        read(tmp_path / "missing.toml")
    with pytest.raises(AclFileError, match=r"missing\.toml"):
        Acl(tmp_path / "missing.toml")


def test_redis_hash_fields_are_allow_rules(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "weir.auth"):
        rules = parse_hash(
            {b"a/#": b"publish", b"users/%u/#": b"all", b"eq #": b"subscribe",
             b"bad/#/x": b"all", b"b": b"read"},
            "weir:acl:alice",
        )  # fmt: skip
    assert len(rules) == 3 and all(r.allow for r in rules)
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 2


def test_acl_settings_from_env_config_file_and_cli(tmp_path: Path) -> None:
    from services.config import SettingsError, load

    assert (load({}, env={}).acl_file, load({}, env={}).acl_no_match) == (None, "deny")
    env = {"WEIR_ACL_FILE": "/etc/weir/acl.toml", "WEIR_ACL_NO_MATCH": "allow"}
    from_env = load({}, env=env)
    assert (from_env.acl_file, from_env.acl_no_match) == ("/etc/weir/acl.toml", "allow")
    config = tmp_path / "weir.toml"
    config.write_text('acl_file = "f.toml"\nacl_redis = true\n')
    from_file = load({"config": str(config), "acl_no_match": "deny"}, env={})
    assert (from_file.acl_file, from_file.acl_redis, from_file.acl_no_match) == (
        "f.toml",
        True,
        "deny",
    )
    with pytest.raises(SettingsError, match="acl_no_match"):
        load({"acl_no_match": "maybe"}, env={})

"""Users in Redis: `weir passwd --redis URL USER` writes argon2id hashes (never the
password); the backend lets the right password in, refuses a wrong one, ignores
users it does not hold, refuses 0x88 when Redis does not answer, and never
accepts a changed password's old one from its cache. paho 3.1.1 and 5.0 over
real sockets, a real redis-server."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from services.auth.api import ALLOW
from services.auth.passwd import PasswordFile
from services.auth.redisusers import FIELD, KEY_PREFIX, RedisUsers
from services.ports import free_port
from services.store.redis import connect
from tests.auth.chainnode import ALLOWED, BAD, UNAVAILABLE, chain_node, refusal_lines
from tests.auth.test_chain import Fixed
from tests.auth.test_password_file import add, weir


def redis_add(url: str, user: str, password: str) -> None:
    result = weir("passwd", "--redis", url, user, "--password-stdin", stdin=password + "\n")
    assert result.returncode == 0, result.stderr


@pytest.mark.redis
def test_weir_passwd_redis_adds_changes_and_deletes(redis_url: str) -> None:
    sync = redis.Redis.from_url(redis_url)
    redis_add(redis_url, "alice", "first-pw")
    first = sync.hget(KEY_PREFIX + "alice", FIELD)
    assert first is not None and first.startswith(b"$argon2id$")
    assert b"first-pw" not in b"".join(sync.hvals(KEY_PREFIX + "alice"))
    redis_add(redis_url, "alice", "second-pw")
    assert sync.hget(KEY_PREFIX + "alice", FIELD) not in (None, first)
    assert weir("passwd", "--redis", redis_url, "alice", "--delete").returncode == 0
    assert not sync.exists(KEY_PREFIX + "alice")


@pytest.mark.parametrize(
    "args",
    [
        ("--redis",),
        ("--redis", "http://x", "u"),
        ("--redis", "redis://h", "f", "u"),
        ("--redis", "redis://h", "a:b"),
    ],
)
def test_weir_passwd_redis_bad_usage_is_one_line_exit_2(args: tuple[str, ...]) -> None:
    result = weir("passwd", *args, "--password-stdin", stdin="pw\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_weir_passwd_redis_unreachable_is_one_line_exit_1() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = weir("passwd", "--redis", url, "alice", "--password-stdin", stdin="pw\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and url in result.stderr


@pytest.mark.redis
@pytest.mark.parametrize("v5", [False, True])
def test_redis_users_over_sockets(
    v5: bool, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis users first, then a password file: a Redis user's right password
    connects, a wrong one is refused by Redis (the file is not asked, though it
    knows the user); a user only the file has falls through to it; a hash that
    is not argon2 is refused. After a password change the old password, though
    it was verified a moment ago, is refused."""
    sync = redis.Redis.from_url(redis_url)
    redis_add(redis_url, "alice", "pw-1")
    sync.hset(KEY_PREFIX + "eve", FIELD, "plaintext")
    path = tmp_path / "passwd"
    add(path, "alice", "file-pw")
    add(path, "bob", "bob-pw")
    caplog.set_level(logging.WARNING, logger="weir.auth")
    with chain_node([RedisUsers(connect(redis_url)), PasswordFile(path)]) as node:
        assert node.connect(v5, "alice", "pw-1") == ALLOWED
        assert node.connect(v5, "alice", "file-pw") == BAD
        assert node.connect(v5, "bob", "bob-pw") == ALLOWED
        assert node.connect(v5, "eve", "plaintext") == BAD
        redis_add(redis_url, "alice", "pw-2")
        assert node.connect(v5, "alice", "pw-1") == BAD, "not from the cache"
        assert node.connect(v5, "alice", "pw-2") == ALLOWED
        assert node.denied() == 3
    lines = refusal_lines(caplog)
    assert lines[0].endswith("by redis users")
    assert lines[1].endswith(f"by redis users: {KEY_PREFIX}eve password_hash is not an argon2 hash")


@pytest.mark.parametrize("v5", [False, True])
def test_redis_not_answering_is_server_unavailable(v5: bool) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    after = Fixed("the next backend", "alice", ALLOW)
    with chain_node([RedisUsers(connect(url, timeout=0.5)), after]) as node:
        assert node.connect(v5, "alice", "pw") == UNAVAILABLE
        assert after.asked == [], "no guess: the next backend is not asked"
        assert node.connect(v5, None, None) != ALLOWED

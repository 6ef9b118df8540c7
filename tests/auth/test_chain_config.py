"""Configuring the chain: [[auth]] tables in the config file, the shortcuts
(--password-file, --auth-redis, --jwt-*, --auth-http, WEIR_*), one-line errors
(exit 2) for bad ones, and `weir up` naming the chain at start and enforcing it."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest

from services.config import SettingsError, load
from services.config.auth import AuthBackend
from tests.auth.chainnode import ALLOWED, BAD, NOT_AUTHORIZED
from tests.auth.test_password_file import add, weir, weir_up
from tests.integration.conftest import Paho

SECRET = "config-test-secret-" + "x" * 45

TABLES = """
[[auth]]
backend = "jwt"
secret = "{secret}"
username_claim = "sub"

[[auth]]
backend = "http"
url = "http://127.0.0.1:9/auth"
timeout_s = 1.5
cache_s = 0
on_error = "ignore"

[[auth]]
backend = "redis"
"""


def test_tables_then_shortcuts_in_order(tmp_path: Path) -> None:
    config = tmp_path / "weir.toml"
    config.write_text(TABLES.format(secret=SECRET))
    cli = {"config": str(config), "password_file": "/p", "auth_http": "http://h/a"}
    chain = load(cli, env={"WEIR_AUTH_REDIS": "true"}).auth
    assert chain == (
        AuthBackend("jwt", secret=SECRET, username_claim="sub"),
        AuthBackend(
            "http", url="http://127.0.0.1:9/auth", timeout_s=1.5, cache_s=0.0, on_error="ignore"
        ),
        AuthBackend("redis"),
        AuthBackend("password_file", path="/p"),
        AuthBackend("http", url="http://h/a"),
    ), "redis is in the tables already: the shortcut adds no second one"
    assert load({}, env={}).auth == ()
    env = {"WEIR_JWT_JWKS": "/k.json", "WEIR_PASSWORD_FILE": "/p"}
    assert [b.backend for b in load({}, env=env).auth] == ["password_file", "jwt"]


BAD_TABLES = [
    ('auth = "jwt"', "expected [[auth]] tables"),
    ('[[auth]]\nbackend = "ldap"', "backend: must be one of"),
    ('[[auth]]\nbackend = "jwt"', "give one of secret, public_key, jwks"),
    ('[[auth]]\nbackend = "jwt"\nsecret = "a"\njwks = "b"', "give one of"),
    ('[[auth]]\nbackend = "jwt"\nsecret = "a"\nurl = "http://x"', "unknown key 'url'"),
    ('[[auth]]\nbackend = "http"\nurl = "ftp://x"', "http:// or https://"),
    ('[[auth]]\nbackend = "http"\nurl = "http://x"\non_error = "maybe"', "'deny' or 'ignore'"),
    ('[[auth]]\nbackend = "http"\nurl = "http://x"\ntimeout_s = -1', "timeout_s"),
    ('[[auth]]\nbackend = "password_file"', "give one of path"),
]


@pytest.mark.parametrize(("text", "words"), BAD_TABLES)
def test_bad_tables_are_one_line_errors(text: str, words: str, tmp_path: Path) -> None:
    config = tmp_path / "weir.toml"
    config.write_text(text + '\n# secret = "hunter2"\n')
    with pytest.raises(SettingsError) as info:
        load({"config": str(config)}, env={})
    message = str(info.value)
    assert words in message and "\n" not in message and str(config) in message


def test_two_jwt_shortcuts_and_a_secret_are_not_echoed(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="give one of jwt_secret"):
        load({"jwt_secret": "s", "jwt_jwks": "/k"}, env={})
    config = tmp_path / "weir.toml"
    config.write_text('[[auth]]\nbackend = "jwt"\nsecret = "hunter2-secret"\nurl = "http://x"\n')
    with pytest.raises(SettingsError) as info:
        load({"config": str(config)}, env={})
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--jwt-jwks", "/nonexistent/jwks.json"), "/nonexistent/jwks.json"),
        (("--jwt-public-key", "/nonexistent/k.pem"), "/nonexistent/k.pem"),
        (("--auth-http", "not-a-url"), "http:// or https://"),
        (("--auth-redis",), "--auth-redis need Redis"),
        (("--jwt-secret", "a", "--jwt-jwks", "b"), "give one of"),
    ],
)
def test_weir_up_refuses_bad_authentication_in_one_line(args: tuple[str, ...], words: str) -> None:
    result = weir("up", "--backend", "memory", "--mqtt-port", "0", "--ws-port", "off", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr


def test_weir_up_names_the_chain_and_enforces_it(tmp_path: Path) -> None:
    """Beyond loopback with a JWT secret (from the environment) and a password
    file: no --allow-anonymous needed; the start line names both in order; a
    good token and a file user connect, a stranger and anonymous do not."""
    passwd = tmp_path / "passwd"
    add(passwd, "alice", "right")
    with weir_up(passwd, WEIR_JWT_SECRET=SECRET) as (port, line):
        assert line.strip() == (
            f"weir: clients authenticate with the password file {passwd}, then JWT "
            "(HMAC secret); anonymous refused"
        )
        good = jwt.encode({"exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
        cases = [("dev", good, ALLOWED), ("alice", "right", ALLOWED), ("mallory", "x", BAD),
                 (None, None, NOT_AUTHORIZED)]  # fmt: skip
        for v5 in (False, True):
            for user, password, expected in cases:
                c = Paho(port, "c1", v5=v5, username=user, password=password)
                try:
                    assert c.connack()[1].getName() == expected, (v5, user)
                finally:
                    c.close()

"""`weir bench idle` with credentials: --username / --password ({i}: the
connection's index) or --jwt-secret (an HS256 token as the password), for
connects per second against an authenticating broker."""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest

from bench import wire
from bench.cli import main
from bench.idle import IdleConfig
from services.auth.jwtauth import Jwt
from services.auth.passwd import PasswordFile
from services.mqtt.codec import decode
from services.mqtt.packets import Connect
from tests.auth.chainnode import chain_node
from tests.auth.test_password_file import add

SECRET = "bench-secret-" + "b" * 51


@pytest.mark.parametrize("version", [wire.MQTT_311, wire.MQTT_5])
def test_connect_with_credentials_decodes(version: int) -> None:
    raw = wire.connect("c7", version=version, username="u7", password=b"p\x00w")
    packet, used = decode(raw, 0)  # type: ignore[misc]
    assert used == len(raw) and isinstance(packet, Connect)
    assert (packet.client_id, packet.username, packet.password) == ("c7", "u7", b"p\x00w")
    plain, _ = decode(wire.connect("c7", version=version), 0)  # type: ignore[misc]
    assert isinstance(plain, Connect) and plain.username is None and plain.password is None


def test_credentials_per_connection() -> None:
    cfg = IdleConfig("127.0.0.1", 1883, 3, username="dev-{i}", password="pw-{i}")
    assert cfg.credentials(2) == ("dev-2", b"pw-2")
    assert IdleConfig("h", 1, 1).credentials(0) == (None, None)
    user, token = IdleConfig("h", 1, 1, username="d{i}", jwt_secret=SECRET).credentials(4)
    assert user == "d4" and token is not None
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "d4" and claims["exp"] > 0


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["fan-in", "--username", "u"], "apply to idle"),
        (["idle", "--password", "p", "--jwt-secret", "s"], "give one"),
    ],
)
def test_credential_usage_errors(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def _idle(port: int, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    argv = ["idle", "--port", str(port), "--connections", "20", "--workers", "1"]
    assert main([*argv, "--duration", "10", *extra]) in (0, 1)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def test_idle_smoke_with_a_password_file_and_jwt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny run, for the options' sake (the measurements are the lead's, on a
    quiet machine): 20 connections in with the right credentials; with a wrong
    password none."""
    path = tmp_path / "passwd"
    add(path, "dev", "pw")
    with chain_node([PasswordFile(path), Jwt(secret=SECRET)]) as node:
        ok = _idle(node.mqtt_port, "--username", "dev", "--password", "pw", capsys=capsys)
        assert (ok["connected"], ok["failed"]) == (20, 0)
        by_jwt = _idle(node.mqtt_port, "--username", "x{i}", "--jwt-secret", SECRET, capsys=capsys)
        assert (by_jwt["connected"], by_jwt["failed"]) == (20, 0)
        refused = _idle(node.mqtt_port, "--username", "dev", "--password", "no", capsys=capsys)
        assert refused == {}
        assert node.denied() == 20

"""The password file: `weir passwd`, the backend's rules, and `weir up --password-file`
with real 3.1.1 and 5.0 clients over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.auth.api import ClientInfo
from services.auth.passwd import PasswordFile, PasswordFileError, parse, read, set_user
from services.ports import free_port
from tests.integration.conftest import Paho
from tests.support.childenv import weir_env

START_S = 20.0


def weir(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def add(path: Path, user: str, password: str) -> None:
    result = weir("passwd", str(path), user, "--password-stdin", stdin=password + "\n")
    assert result.returncode == 0, result.stderr


def client(user: str | None) -> ClientInfo:
    return ClientInfo(client_id="c1", username=user, peer="127.0.0.1:1", protocol_level=5)


def test_weir_passwd_adds_changes_and_deletes_users_and_never_stores_the_password(
    tmp_path: Path,
) -> None:
    path = tmp_path / "passwd"
    add(path, "alice", "s3cret-a")
    add(path, "bob", "s3cret-b")
    first = read(path)
    assert set(first) == {"alice", "bob"}
    assert all(h.startswith("$argon2id$") for h in first.values())
    assert "s3cret" not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    add(path, "alice", "changed")
    second = read(path)
    assert second["bob"] == first["bob"] and second["alice"] != first["alice"]
    assert weir("passwd", str(path), "bob", "--delete").returncode == 0
    assert set(read(path)) == {"alice"}


@pytest.mark.parametrize(
    "args", [(), ("only-file",), ("f", "a:b", "--password-stdin"), ("f", "u", "--bogus")]
)
def test_weir_passwd_bad_usage_is_one_line_exit_2(args: tuple[str, ...], tmp_path: Path) -> None:
    result = weir("passwd", *args, stdin="pw\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_malformed_lines_are_named() -> None:
    with pytest.raises(PasswordFileError, match="line 2"):
        parse("# users\nalice:plaintext\n", "password file x")


@pytest.fixture
def passwd(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    add(path, "alice", "right")
    return path


def test_backend_rules(passwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user of the file: allow or 0x86; anyone else: ignore (None), for the chain."""
    from services.auth import argon

    backend = PasswordFile(passwd)
    calls: list[str] = []
    verify = argon._verify_now

    def counting(hashed: str, password: bytes) -> bool:
        calls.append(hashed)
        return verify(hashed, password)

    monkeypatch.setattr(argon, "_verify_now", counting)

    async def decide(user: str | None, password: bytes | None) -> tuple[bool, int] | None:
        d = await backend.check(client(user), password)
        return None if d is None else (d.ok, d.reason_code)

    assert asyncio.run(decide("alice", b"right")) == (True, 0)
    assert asyncio.run(decide("alice", b"right")) == (True, 0)
    assert len(calls) == 1, "a verified pair is remembered, not verified again"
    assert asyncio.run(decide("alice", b"wrong")) == (False, 0x86)
    assert asyncio.run(decide("alice", b"wrong")) == (False, 0x86)
    assert len(calls) == 3, "refusals are never cached"
    assert asyncio.run(decide("alice", None)) == (False, 0x86)
    assert asyncio.run(decide("mallory", b"right")) is None
    assert asyncio.run(decide(None, None)) is None


def test_the_file_is_reloaded_when_it_changes_and_a_bad_one_keeps_the_old_users(
    passwd: Path,
) -> None:
    backend = PasswordFile(passwd, reload_check_s=0.0)

    async def ok(user: str, password: bytes) -> bool:
        decision = await backend.check(client(user), password)
        return decision is not None and decision.ok

    add(passwd, "carol", "c-pass")
    os.utime(passwd, (1, 1))  # a new modification time, whatever the clock's resolution
    assert asyncio.run(ok("carol", b"c-pass"))
    passwd.write_text("garbage line\n")
    os.utime(passwd, (2, 2))
    assert asyncio.run(ok("alice", b"right")), "a bad file keeps the users read before"


def test_a_user_just_added_or_changed_gets_in_before_the_next_periodic_look(
    passwd: Path,
) -> None:
    backend = PasswordFile(passwd, reload_check_s=3600.0)  # the periodic look never comes

    async def ok(user: str, password: bytes) -> bool:
        decision = await backend.check(client(user), password)
        return decision is not None and decision.ok

    assert not asyncio.run(ok("carol", b"c-pass"))
    set_user(passwd, "carol", "c-pass")
    os.utime(passwd, (1, 1))
    assert asyncio.run(ok("carol", b"c-pass")), "an unknown user makes it look at once"
    set_user(passwd, "carol", "c-new")
    os.utime(passwd, (2, 2))
    assert asyncio.run(ok("carol", b"c-new")), "a refused password makes it look at once"
    assert not asyncio.run(ok("carol", b"c-pass"))
    set_user(passwd, "carol", None)
    os.utime(passwd, (3, 3))
    assert asyncio.run(ok("carol", b"c-new")), "an accepted one does not (up to a second)"


@contextlib.contextmanager
def weir_up(passwd: Path, **env_extra: str) -> Iterator[tuple[int, str]]:
    """`weir up` beyond loopback with this password file (and WEIR_* `env_extra`):
    its MQTT port and the start line that says who gets in."""
    port = free_port()
    env = weir_env() | env_extra
    proc = subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--backend", "memory", "--host", "0.0.0.0",
         "--mqtt-port", str(port), "--ws-port", "off", "--password-file", str(passwd)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert "ready" in ready, ready + (proc.stderr.read() if proc.poll() is not None else "")
        yield port, proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=START_S)


@pytest.fixture
def node(passwd: Path) -> Iterator[int]:
    with weir_up(passwd) as (port, who):
        assert "password file" in who
        yield port


@pytest.mark.parametrize("v5", [False, True])
def test_clients_of_a_node_with_a_password_file(node: int, v5: bool) -> None:
    """Beyond loopback with a password file: no --allow-anonymous needed. The
    right password connects; a wrong one or an unknown user gets "bad user
    name or password" (5.0 0x86, 3.1.1 4); anonymous gets "not authorized"
    (5.0 0x87, 3.1.1 5)."""
    # paho reports a 3.1.1 return code as the 5.0 reason of the same meaning
    # (4 as 0x86, 5 as 0x87), so both levels are checked by name.
    bad, refused = "Bad user name or password", "Not authorized"
    cases = [("alice", "right", "Success"), ("alice", "wrong", bad)]
    cases += [("mallory", "right", bad), (None, None, refused)]
    for i, (user, password, expected) in enumerate(cases):
        c = Paho(node, f"c{i}", v5=v5, username=user, password=password)
        try:
            rc = c.connack()[1]
            assert rc.getName() == expected, (user, password, rc)
        finally:
            c.close()


def test_a_bad_password_file_stops_weir_up_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "passwd"
    bad.write_text("alice:plain\n")
    for path in (bad, tmp_path / "missing"):
        result = weir("up", "--backend", "memory", "--password-file", str(path), "--mqtt-port", "0")
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr

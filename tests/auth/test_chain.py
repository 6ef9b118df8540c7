"""The authentication chain: order (the first allow or deny decides, ignore falls
through), the anonymous rules, and a refusal's reason code, log line and count,
with paho 3.1.1 and 5.0 clients over real sockets."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from services.auth.api import ALLOW, ClientInfo, Decision
from services.auth.cache import Verdict
from services.auth.chain import Chain
from services.auth.passwd import PasswordFile
from tests.auth.chainnode import ALLOWED, BAD, NOT_AUTHORIZED, chain_node, refusal_lines
from tests.auth.test_password_file import add
from tests.support.wait import until


class Fixed:
    """A backend that answers `verdict` for user `user` and ignores everyone else."""

    def __init__(self, name: str, user: str, verdict: Verdict) -> None:
        self.name = name
        self.user = user
        self.verdict = verdict
        self.asked: list[str | None] = []

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        self.asked.append(client.username)
        return self.verdict if client.username == self.user else None


def info(user: str | None) -> ClientInfo:
    return ClientInfo("c1", user, "127.0.0.1:5", 5)


def decide(chain: Chain, user: str | None) -> Decision:
    return asyncio.run(chain.authenticate(info(user), b"pw"))


def test_the_first_decisive_answer_wins_and_ignore_falls_through() -> None:
    deny = Fixed("first", "bob", Decision(False, 0x86))
    allow = Fixed("second", "bob", ALLOW)
    also = Fixed("third", "carol", ALLOW)
    chain = Chain([deny, allow, also])
    assert decide(chain, "bob") == Decision(False, 0x86, "first")
    assert allow.asked == [], "nothing after a decisive answer is asked"
    assert decide(chain, "carol") == Decision(True, 0, "third")
    assert deny.asked == ["bob", "carol"] and allow.asked == ["carol"]
    reordered = Chain([allow, deny])
    assert decide(reordered, "bob").ok


def test_when_every_backend_ignores_the_anonymous_rules_decide() -> None:
    nobody = Fixed("none", "zed", ALLOW)
    assert decide(Chain([nobody]), None).reason_code == 0x87
    assert decide(Chain([nobody], allow_anonymous=True), None).ok
    unknown = decide(Chain([nobody], allow_anonymous=True), "mallory")
    assert (unknown.ok, unknown.reason_code) == (False, 0x86), "a named stranger is not anonymous"
    assert "anonymous rules" in unknown.by


def test_a_listeners_own_allow_anonymous_overrides_the_nodes(tmp_path: Path) -> None:
    """[[listener]] allow_anonymous reaches the chain built from the settings."""
    from services.config import load
    from services.node.authn import authenticator

    config = tmp_path / "weir.toml"
    config.write_text(
        '[[listener]]\nname = "open"\ntype = "tcp"\nport = 0\nallow_anonymous = true\n'
    )
    path = tmp_path / "passwd"
    add(path, "alice", "right")
    chain = authenticator(load({"config": str(config), "password_file": str(path)}, env={}))
    assert isinstance(chain, Chain) and chain.listeners == {"open": True}

    def anonymous_on(listener: str) -> bool:
        client = ClientInfo("c1", None, "127.0.0.1:5", 5, listener)
        return asyncio.run(chain.authenticate(client, None)).ok

    assert anonymous_on("open") and not anonymous_on("mqtt")


def test_a_changed_password_file_password_is_not_taken_from_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    add(path, "alice", "old")
    backend = PasswordFile(path, reload_check_s=0.0)

    async def ok(password: bytes) -> bool:
        decision = await backend.check(info("alice"), password)
        return decision is not None and decision.ok

    assert asyncio.run(ok(b"old")) and len(backend.cache) == 1
    add(path, "alice", "new")
    os.utime(path, (3, 3))  # a new modification time, whatever the clock's resolution
    assert not asyncio.run(ok(b"old"))
    assert asyncio.run(ok(b"new"))


def test_past_the_pending_verifies_a_connect_is_refused_busy_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two verifies held in the pool: a third user's CONNECT gets 0x89 without
    waiting (and without a verify); once released, the two are let in."""
    import threading

    from services.auth import argon

    path = tmp_path / "passwd"
    for user in ("u1", "u2", "u3"):
        add(path, user, "pw")
    backend = PasswordFile(path)
    release = threading.Event()
    started: list[str] = []
    verify = argon._verify_now

    def held(hashed: str, password: bytes) -> bool:
        started.append(hashed)
        assert release.wait(10)
        return verify(hashed, password)

    monkeypatch.setattr(argon, "_verify_now", held)
    monkeypatch.setattr(argon, "MAX_PENDING", 2)

    async def run() -> list[Verdict]:
        first = [asyncio.ensure_future(backend.check(info(u), b"pw")) for u in ("u1", "u2")]
        await until(lambda: len(started) == 2, "both verifies running in the pool")
        busy = await backend.check(info("u3"), b"pw")
        release.set()
        return [busy, *await asyncio.gather(*first)]

    busy, one, two = asyncio.run(run())
    assert busy is not None and (busy.ok, busy.reason_code) == (False, 0x89)
    assert one == ALLOW and two == ALLOW and len(started) == 2
    assert argon._pending == 0


def test_a_backend_reason_names_it_in_the_decision() -> None:
    why = Fixed("jwt", "bob", Decision(False, 0x86, "jwt: expired"))
    assert decide(Chain([why]), "bob").by == "jwt: expired"


@pytest.mark.parametrize("v5", [False, True])
def test_a_chain_over_sockets(v5: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Password file first, then a backend that knows only "bob": alice's right
    password is in; her wrong one is refused by the file (the second backend
    is not asked); bob falls through the file to the second backend; an
    unknown user and an anonymous client get 0x86 and 0x87. Each refusal is
    counted once and logged once with client id, user, peer and backend."""
    path = tmp_path / "passwd"
    add(path, "alice", "right")
    second = Fixed("the second backend", "bob", Decision(False, 0x87))
    caplog.set_level(logging.WARNING, logger="weir.auth")
    with chain_node([PasswordFile(path), second]) as node:
        assert node.connect(v5, "alice", "right") == ALLOWED
        assert node.connect(v5, "alice", "wrong", client_id="dev-7") == BAD
        assert second.asked == []
        assert node.connect(v5, "bob", "any") == NOT_AUTHORIZED
        assert second.asked == ["bob"]
        assert node.connect(v5, "mallory", "x") == BAD
        assert node.connect(v5, None, None) == NOT_AUTHORIZED
        assert node.denied() == 4
    lines = refusal_lines(caplog)
    assert len(lines) == 4, lines
    assert lines[0].startswith("connect refused 0x86: client dev-7, user alice, peer 127.0.0.1:")
    assert lines[0].endswith(f"by password file {path}")
    assert lines[1].endswith("by the second backend")
    assert "by anonymous rules" in lines[2] and "by anonymous rules" in lines[3]


@pytest.mark.parametrize("v5", [False, True])
def test_anonymous_allowed_by_the_chain(v5: bool, tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    add(path, "alice", "right")
    with chain_node([PasswordFile(path)], allow_anonymous=True) as node:
        assert node.connect(v5, None, None) == ALLOWED
        assert node.connect(v5, "alice", "wrong") == BAD
        assert node.denied() == 1

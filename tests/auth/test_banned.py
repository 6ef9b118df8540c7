"""The ban table's rules (kinds, CIDR, expiry), `weir ban`'s times, the read
budget's arithmetic, and `weir up`'s bad limit values (exit 2, one line)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.auth import banned
from services.auth.banned import Ban, BanError, MemoryBans, RedisBans, checked, peer_host
from services.auth.cli import parse_until
from services.auth.limits import ClientRates
from services.config import SettingsError
from services.mqtt.packets import Pingreq, Publish
from tests.support.wait import until


def test_a_ban_matches_its_kind_only_while_active() -> None:
    added: list[Ban] = []
    bans = MemoryBans(added.append)
    now = time.time()
    asyncio.run(bans.add(Ban("clientid", "c1", now + 60)))
    asyncio.run(bans.add(Ban("username", "u1")))
    asyncio.run(bans.add(Ban("peerhost", "10.1.2.3/16", now + 60)))
    asyncio.run(bans.add(Ban("clientid", "old", now - 1)))
    assert [b.who for b in added] == ["c1", "u1", "10.1.0.0/16"]  # the expired one: not
    assert bans.match("c1", None, "1.1.1.1:5") is not None
    assert bans.match("c2", "u1", "1.1.1.1:5") is not None
    assert bans.match("c2", "u2", "10.1.200.1:5") is not None
    assert bans.match("c2", "u2", "[::1]:5") is None
    assert bans.match("old", None, "1.1.1.1:5") is None
    assert [b.field for b in asyncio.run(bans.list())] == [
        "clientid:c1", "peerhost:10.1.0.0/16", "username:u1"]  # fmt: skip
    assert asyncio.run(bans.delete("clientid", "c1"))
    assert bans.match("c1", None, "1.1.1.1:5") is None
    assert not asyncio.run(bans.delete("clientid", "c1"))


@pytest.mark.parametrize("ban", [Ban("ip", "x"), Ban("clientid", ""), Ban("peerhost", "300.0.0.1")])
def test_bad_bans_are_refused(ban: Ban) -> None:
    with pytest.raises(BanError):
        checked(ban)


def test_peer_host() -> None:
    assert [peer_host(p) for p in ("1.2.3.4:5", "[::1]:5", "?")] == ["1.2.3.4", "::1", "?"]


def test_until() -> None:
    assert parse_until(None, 100.0) is None
    assert parse_until("90s", 100.0) == 190.0
    assert parse_until("2d", 0.0) == 172_800.0
    assert parse_until("1700000000", 0.0) == 1_700_000_000.0
    assert parse_until("2026-01-01T00:00:00Z", 0.0) == 1_767_225_600.0
    with pytest.raises(SettingsError):
        parse_until("soon", 0.0)


def test_a_budget_takes_until_a_window_is_spent() -> None:
    """5 PUBLISHes and 100 bytes a minute: a PINGREQ costs bytes only; a
    packet that does not fit what is left waits; a packet larger than a whole
    window goes alone."""
    paused: list[str] = []
    budget = ClientRates("5/minute", "100/minute").budget("c", lambda b, rule: paused.append(rule))
    budget.refresh()
    publish = Publish("t", b"", qos=0)
    assert [budget.take(publish, 10) for _ in range(5)] == [True] * 5
    assert not budget.take(publish, 10)
    assert budget.take(Pingreq(), 2)
    assert not budget.take(Pingreq(), 49)  # 48 bytes left
    assert budget.settle(True) > 0 and paused == ["messages 5 per 1 minute"]
    big = ClientRates(None, "100/minute").budget("d", lambda b, rule: None)
    big.refresh()
    assert big.take(Pingreq(), 500)  # a whole window: it goes
    assert not big.take(Pingreq(), 1)
    assert big.settle(True) > 0


@pytest.mark.parametrize(
    "args",
    [
        ("--client-msg-rate", "lots"),
        ("--client-byte-rate", "0/second"),
        ("--max-conn-rate", "5"),
        ("--rate-storage", "disk"),
        ("--max-subscriptions", "-1"),
        ("--flapping-window", "0"),
        ("--flapping-max-connects", "0"),
        ("--rate-storage", "redis"),  # with --backend memory: no Redis to count in
    ],
)
def test_bad_limit_values_stop_weir_up_in_one_line(args: tuple[str, ...]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services", "up", "--backend", "memory", "--mqtt-port", "0",
         "--ws-port", "off", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and args[0] in result.stderr


def test_limits_from_the_config_file(tmp_path: Path) -> None:
    from services.config import load

    good = tmp_path / "good.toml"
    good.write_text('[limits]\nclient_msg_rate = "10/second"\nflapping = true\nmax_inflight = 4\n')
    limits = load({"config": str(good)}, env={}).limits
    assert (limits.client_msg_rate, limits.flapping, limits.max_inflight) == ("10/second", True, 4)
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\nmax_conn_rate = "often"\n')
    with pytest.raises(SettingsError, match=r"limits\.max_conn_rate"):
        load({"config": str(bad)}, env={})


class Unanswering:
    """A Redis that takes calls and never answers (frozen, or cut off)."""

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        await asyncio.Event().wait()
        return {}


async def test_a_poll_that_gets_no_answer_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The line named nothing ("bans not read from Redis: "): a TimeoutError's
    text is empty."""
    monkeypatch.setattr(banned, "CALL_S", 0.01)
    bans = RedisBans(Unanswering(), poll_s=0.0)
    poll = asyncio.create_task(bans._poll())
    try:
        await until(lambda: "bans not read" in caplog.text, "the warning")
    finally:
        poll.cancel()
    line = next(r.getMessage() for r in caplog.records if "bans not read" in r.getMessage())
    assert line == "bans not read from Redis: TimeoutError()"

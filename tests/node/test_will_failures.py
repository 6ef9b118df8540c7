"""Wills where something fails (issue 23): the discard of a normal DISCONNECT
comes before the session's end, a will that cannot be stored refuses its
CONNECT, and a will published by a survivor is checked as its client.
Over a fake transport with the memory stores, a will store wrapped where a
step must be held or must fail."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.auth.api import Action, ClientInfo
from services.broker.broker import Broker
from services.broker.seams import Seams
from services.broker.timers import TimerWheel
from services.mqtt import codec
from services.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Message,
    Publish,
    Subscribe,
    Subscription,
    Will,
)
from services.node.app import build_services
from services.node.node import Services, channel_config, flow
from services.session.api import StoredWill, StoreUnavailable
from services.session.memory import MemoryWillStore
from services.store import serial
from tests.node.test_connection import Harness, settings, wait_for

OVERLAP_BOUND_S = 5.0  # how long one adopt waits for a second: fails, never passes, by time


class HeldWills(MemoryWillStore):
    """A memory will store whose `take` waits for `release`, and whose `put`
    fails while `down` (Redis gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.taking = False
        self.release = asyncio.Event()
        self.release.set()
        self.down = False

    async def put(self, *args: Any, **kwargs: Any) -> StoredWill | None:
        if self.down:
            raise StoreUnavailable("redis did not answer: test")
        return await super().put(*args, **kwargs)

    async def take(self, client_id: str, token: str) -> bytes | None:
        self.taking = True
        await self.release.wait()
        return await super().take(client_id, token)


class OnlyAlice:
    """Only the user alice, from 10.0.0.7, may publish to will/#."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, str, bool]] = []  # will checks: user, peer, answer

    def allowed(self, client: ClientInfo, action: Action, topic: str, qos: int, retain: bool) -> (
        bool
    ):  # fmt: skip
        if action is Action.PUBLISH and topic.startswith("will/"):
            ok = client.username == "alice" and client.peer.startswith("10.0.0.7:")
            self.asked.append((client.username, client.peer, ok))
            return ok
        return True


async def harness_with(
    wills: MemoryWillStore, seams: Seams | None = None
) -> tuple[Harness, Services]:
    s = settings()
    services = build_services(s)
    seams = seams if seams is not None else Seams()
    loop = asyncio.get_running_loop()
    broker = Broker(
        node_id=s.node_id,
        channel_config=channel_config(s, seams),
        flow=flow(s),
        max_connections=s.limits.max_connections,
        queue_limit=s.limits.queue_limit,
        sessions=services.sessions,
        queue=services.queue,
        retain=services.retain,
        loop=loop,
        wheel=TimerWheel(loop),
        events=services.events,
        seams=seams,
        wills=wills,
    )
    return Harness(broker, loop), services


def connect_with_will(client_id: str, level: int) -> bytes:
    connect = Connect(client_id, protocol_level=level, will=Will("will/x", b"w", 1))
    return codec.encode(connect, level)


async def test_a_normal_disconnect_discards_the_will_before_the_session_ends() -> None:
    """Before: the will was taken in a background task while the session was
    released at once, so a node dying in between left a will a survivor would
    publish for a session the log already showed ended normally."""
    wills = HeldWills()
    h, services = await harness_with(wills)
    conn, t = h.open()
    conn.data_received(connect_with_will("leaver", 5))
    await wait_for(lambda: any(isinstance(p, Connack) for p in t.packets(5)), "connack")
    wills.release.clear()
    conn.data_received(codec.encode(Disconnect(), 5))
    await wait_for(lambda: wills.taking, "the will's discard")
    info = await services.sessions.get("leaver")
    assert info is not None and info.online  # the end waits for the discard
    assert await wills.orphans("t") == ["leaver"]
    wills.release.set()
    await wait_for(lambda: "leaver" not in h.broker.cm._ending, "the session's end")
    assert await services.sessions.get("leaver") is None
    assert await wills.orphans("t") == []


@pytest.mark.parametrize(("level", "code"), [(5, 0x88), (4, 3)])
async def test_a_will_that_cannot_be_stored_refuses_the_connect(level: int, code: int) -> None:
    """Before: the will was kept in this node's memory and CONNACK 0 went out."""
    wills = HeldWills()
    wills.down = True
    h, services = await harness_with(wills)
    conn, t = h.open()
    conn.data_received(connect_with_will("w", level))
    await wait_for(lambda: any(isinstance(p, Connack) for p in t.packets(level)), "connack")
    connack = next(p for p in t.packets(level) if isinstance(p, Connack))
    assert connack.reason_code == code
    await wait_for(lambda: "w" not in h.broker.cm._ending, "the refused session's end")
    assert await services.sessions.get("w") is None  # not left online under this node
    # Without a will there is nothing to store: the CONNECT goes through.
    other, t2 = h.open()
    other.data_received(codec.encode(Connect("nowill", protocol_level=level), level))
    await wait_for(lambda: any(isinstance(p, Connack) for p in t2.packets(level)), "connack")
    assert [p.reason_code for p in t2.packets(level) if isinstance(p, Connack)] == [0]


async def test_an_adopted_will_is_checked_as_the_client_that_set_it() -> None:
    """Before: a survivor asked the ACL as a client with no user name and no
    address, so a rule that lets alice publish her will refused it."""
    wills = HeldWills()
    acl = OnlyAlice()
    h, _ = await harness_with(wills, Seams(authorizer=acl))
    watcher, t = await h.connected("watcher")
    watcher.data_received(codec.encode(Subscribe(1, (Subscription("will/#", 1),)), 5))
    await wait_for(lambda: len(t.packets(5)) >= 2, "suback")
    for client, user, peer in (("a", "alice", "10.0.0.7:5000"), ("b", "bob", "10.0.0.7:5001")):
        blob = serial.dumps(Message(f"will/{client}", b"gone", 1, sender=client))
        await wills.put(client, "dead", "tok-" + client, blob, 0, user, peer)
    assert await h.broker.wills.adopt_from("dead") == 2
    await wait_for(lambda: len(acl.asked) == 2, "both wills checked")
    assert sorted(acl.asked) == [
        ("alice", "10.0.0.7:5000", True), ("bob", "10.0.0.7:5001", False),
    ]  # fmt: skip
    await wait_for(lambda: any(isinstance(p, Publish) for p in t.packets(5)), "alice's will")
    assert [p.topic for p in t.packets(5) if isinstance(p, Publish)] == ["will/a"]


class OverlappingWills(MemoryWillStore):
    """A memory will store whose `adopt` returns only once two are under way."""

    def __init__(self) -> None:
        super().__init__()
        self.adopting = 0
        self.two = asyncio.Event()

    async def adopt(self, *args: Any, **kwargs: Any) -> StoredWill | None:
        self.adopting += 1
        if self.adopting >= 2:
            self.two.set()
        await asyncio.wait_for(self.two.wait(), OVERLAP_BOUND_S)
        return await super().adopt(*args, **kwargs)


async def test_a_dead_nodes_wills_are_adopted_several_at_once() -> None:
    """Before: one store round trip after the other (a 5,000-session node's
    last will went out 20 s after its death was seen): this timed out."""
    wills = OverlappingWills()
    h, _ = await harness_with(wills)
    for client in ("a", "b", "c"):
        blob = serial.dumps(Message(f"will/{client}", b"gone", 1, sender=client))
        await wills.put(client, "dead", "tok-" + client, blob, 0, None, "")
    assert await h.broker.wills.adopt_from("dead") == 3


class TakeFailsOnce(MemoryWillStore):
    """A memory will store whose first `take` finds Redis gone."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = 0

    async def take(self, client_id: str, token: str) -> bytes | None:
        self.takes += 1
        if self.takes == 1:
            raise StoreUnavailable("redis did not answer: test")
        return await super().take(client_id, token)


async def test_an_adopted_will_the_store_did_not_hand_over_is_sent_on_a_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a take that timed out (18,000 at once outwaited the store's
    2 s) logged a warning and the will was never published."""
    monkeypatch.setattr("services.broker.wills.RETRY_S", 0.05)
    wills = TakeFailsOnce()
    h, _ = await harness_with(wills)
    watcher, t = await h.connected("watcher")
    watcher.data_received(codec.encode(Subscribe(1, (Subscription("will/#", 1),)), 5))
    await wait_for(lambda: len(t.packets(5)) >= 2, "suback")
    blob = serial.dumps(Message("will/a", b"gone", 1, sender="a"))
    await wills.put("a", "dead", "tok-a", blob, 0, None, "")
    assert await h.broker.wills.adopt_from("dead") == 1
    await wait_for(lambda: any(isinstance(p, Publish) for p in t.packets(5)), "the will")
    assert [p.topic for p in t.packets(5) if isinstance(p, Publish)] == ["will/a"]
    assert wills.takes == 2

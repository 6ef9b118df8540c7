"""Cluster links over real loopback sockets: handshake, order, batching,
back-pressure, reconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from services.cluster.frames import PROTOCOL_VERSION, LinkHandler, hello, parse_hello
from services.cluster.links import Links
from services.mqtt.packets import Message, Properties
from services.ports import free_port
from tests.support.wait import until


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def on_forward(self, peer: str, message: Message, client_ids: Sequence[str]) -> None:
        self.events.append(("forward", peer, message, tuple(client_ids)))

    def on_notify(self, peer: str, client_ids: Sequence[str]) -> None:
        self.events.append(("notify", peer, tuple(client_ids)))

    def on_kick(self, peer: str, client_id: str, epoch: int) -> None:
        self.events.append(("kick", peer, client_id, epoch))


class Pair:
    def __init__(self) -> None:
        self.made: list[Links] = []

    async def links(self, node_id: str, handler: LinkHandler, **kw: object) -> Links:
        links = Links(node_id, handler, backoff_min_s=0.01, backoff_max_s=0.05, **kw)  # type: ignore[arg-type]
        await links.start()
        self.made.append(links)
        return links


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    p = Pair()
    yield p
    for links in p.made:
        await links.close()


async def test_frames_arrive_in_order_with_the_sender_named(pair: Pair) -> None:
    rec = Recorder()
    a = await pair.links("a", Recorder())
    b = await pair.links("b", rec)
    await a.set_peer("b", b.address)
    m1 = Message("t/1", b"x", 0)
    m2 = Message(
        "t/2",
        b"\x00" * 1000,
        1,
        retain=True,
        properties=Properties(content_type="c", user_property=(("k", "v"),)),
        sender="pub",
        expires_at_ms=123456789,
    )
    assert a.forward("b", m1, ["c1", "c2"])
    assert a.notify("b", ["p1", "p\u00e9"])
    assert a.forward("b", m2, ["c3"])
    assert a.kick("b", "old", 2**40 + 7)
    await until(lambda: len(rec.events) == 4)
    assert rec.events == [
        ("forward", "a", m1, ("c1", "c2")),
        ("notify", "a", ("p1", "p\u00e9")),
        ("forward", "a", m2, ("c3",)),
        ("kick", "a", "old", 2**40 + 7),
    ]


async def test_one_write_per_loop_turn(pair: Pair) -> None:
    rec = Recorder()
    a = await pair.links("a", Recorder())
    b = await pair.links("b", rec)
    await a.set_peer("b", b.address)
    assert await a.wait_connected("b", 5.0)
    before = a.stats("b").writes
    for i in range(500):
        a.forward("b", Message(f"t/{i}", b"p", 1), ["c"])
    await until(lambda: len(rec.events) == 500)
    assert a.stats("b").writes == before + 1
    assert [e[2].topic for e in rec.events] == [f"t/{i}" for i in range(500)]  # type: ignore[attr-defined]


async def test_buffer_limit_drops_only_qos0_forwards_and_counts_them(pair: Pair) -> None:
    rec = Recorder()
    a = await pair.links("a", Recorder(), buffer_limit=4096)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: frames wait in the buffer
    await a.set_peer("b", dead)
    payload = b"z" * 1000
    kept0 = sum(a.forward("b", Message("q0", payload, 0), ["c"]) for _ in range(10))
    assert 0 < kept0 < 10
    assert a.stats("b").dropped == 10 - kept0
    assert all(a.forward("b", Message("q1", payload, 1), ["c"]) for _ in range(10))
    assert a.notify("b", ["p"])
    assert a.kick("b", "k", 1)
    assert a.stats("b").dropped == 10 - kept0
    assert a.backlog("b") > 4096
    b = await pair.links("b", rec)
    await a.set_peer("b", b.address)
    await until(lambda: len(rec.events) == kept0 + 12)
    kinds = [e[0] if e[0] != "forward" else e[2].topic for e in rec.events]  # type: ignore[attr-defined]
    assert kinds == ["q0"] * kept0 + ["q1"] * 10 + ["notify", "kick"]
    assert a.backlog("b") == 0


async def test_hold_past_the_limit_and_drained_once_the_buffer_went_out(pair: Pair) -> None:
    rec = Recorder()
    drained: list[str] = []
    a = await pair.links("a", Recorder(), buffer_limit=4096, on_drained=drained.append)
    await a.set_peer("b", f"127.0.0.1:{free_port()}")  # nothing listens yet
    assert a.forward("b", Message("q1", b"z" * 1000, 1), ["c"])
    assert not a.hold("b")  # under the limit: nobody waits
    for _ in range(5):
        a.forward("b", Message("q1", b"z" * 1000, 1), ["c"])
    assert a.hold("b") and not a.hold("nobody")
    assert drained == []
    b = await pair.links("b", rec)
    await a.set_peer("b", b.address)  # the buffer moves to the new address and goes out
    await until(lambda: drained == ["b"])
    assert len(rec.events) <= 6 and a.backlog("b") == 0
    await until(lambda: len(rec.events) == 6)
    assert drained == ["b"]  # once per hold


async def test_a_removed_peer_releases_its_holds(pair: Pair) -> None:
    drained: list[str] = []
    a = await pair.links("a", Recorder(), buffer_limit=1024, on_drained=drained.append)
    await a.set_peer("b", f"127.0.0.1:{free_port()}")
    for _ in range(3):
        a.forward("b", Message("q2", b"z" * 1000, 2), ["c"])
    assert a.hold("b")
    await a.remove_peer("b")  # it died: nothing more will go there
    assert drained == ["b"]


async def test_a_flush_onto_a_closed_link_keeps_its_frames(pair: Pair) -> None:
    """A flush that runs after the link broke (its peer died) leaves the frames
    for the next link instead of writing to the closed transport (an error)."""
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
    rec = Recorder()
    a = await pair.links("a", Recorder())
    b = await pair.links("b", rec)
    await a.set_peer("b", b.address)
    assert await a.wait_connected("b", 5.0)
    peer = a._peers["b"]
    assert peer.transport is not None
    peer.transport.close()  # broken, and the flush below is already scheduled
    assert a.forward("b", Message("t/kept", b"x", 1), ["c"])
    await until(lambda: len(rec.events) == 1)  # over the next link
    assert rec.events[0][2].topic == "t/kept"  # type: ignore[attr-defined]
    assert errors == []


async def test_reconnects_after_the_peer_restarts_on_the_same_port(pair: Pair) -> None:
    first, second = Recorder(), Recorder()
    a = await pair.links("a", Recorder())
    b1 = await pair.links("b", first)
    await a.set_peer("b", b1.address)
    a.notify("b", ["before"])
    await until(lambda: len(first.events) == 1)
    await b1.close()
    await until(lambda: not a.is_connected("b"))
    a.notify("b", ["after"])  # buffered while b is down
    await pair.links("b", second, port=b1.port)
    await until(lambda: len(second.events) == 1)
    assert second.events == [("notify", "a", ("after",))]
    assert a.stats("b").connects == 2


async def test_unknown_peer_is_counted_not_raised(pair: Pair) -> None:
    a = await pair.links("a", Recorder())
    assert not a.forward("nobody", Message("t", b"", 1), ["c"])
    assert a.unroutable == 1


async def test_listener_answers_and_closes_another_protocol_version(pair: Pair) -> None:
    rec = Recorder()
    b = await pair.links("b", rec)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(hello("x", PROTOCOL_VERSION + 1) + b"\x00\x00\x00\x02\x02\x00")
    async with asyncio.timeout(5):
        data = await reader.read()  # to EOF: the listener closes
    writer.close()
    parsed = parse_hello(data)
    assert parsed is not None
    assert parsed[:2] == (PROTOCOL_VERSION, "b")
    assert rec.events == []


async def test_dialler_rejects_a_listener_with_another_node_id(pair: Pair) -> None:
    rec = Recorder()
    a = await pair.links("a", Recorder())
    impostor = await pair.links("c", rec)
    await a.set_peer("b", impostor.address)
    a.notify("b", ["x"])
    await until(lambda: a.stats("b").rejected >= 2)
    assert rec.events == []
    assert a.backlog("b") > 0


async def test_garbage_closes_only_that_link(pair: Pair) -> None:
    rec = Recorder()
    a = await pair.links("a", Recorder())
    b = await pair.links("b", rec)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    async with asyncio.timeout(5):
        assert await reader.read() == b""
    writer.close()
    await a.set_peer("b", b.address)
    a.notify("b", ["ok"])
    await until(lambda: rec.events == [("notify", "a", ("ok",))])

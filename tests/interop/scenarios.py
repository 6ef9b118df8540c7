"""The interop scenarios, written once against the adapter surface (api.py).

Each scenario takes a client, the broker and a tag unique to the run (topics
and client ids start with it, so scenarios never see each other's messages)
and asserts what an application using that client would see. Waits are
bounded and end as soon as what is expected has come; an absence is checked
with a barrier (a later message on the same path), not a sleep.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.interop.api import REFUSED, Broker, Client, ConnectSpec, Props, Will

Scenario = Callable[[Client, Broker, str], Awaitable[str | None]]
"""Runs one scenario; returns a note for the matrix (how it went, when partly)."""

BURST = 1000
WAIT_S = 15.0  # a burst through a busy 2-core machine, with time to spare
SHARED_COUNT = 100
QUEUED = 10


async def connect_v311(c: Client, b: Broker, tag: str) -> str | None:
    conn = await c.connect(b, ConnectSpec(f"{tag}-c", version=4))
    assert conn.session_present in (False, None)
    await conn.end()
    return None


async def connect_v5(c: Client, b: Broker, tag: str) -> str | None:
    conn = await c.connect(b, ConnectSpec(f"{tag}-c", version=5))
    assert conn.session_present in (False, None)
    await conn.end()
    return None


async def wildcards(c: Client, b: Broker, tag: str) -> str | None:
    sub = await c.connect(b, ConnectSpec(f"{tag}-s"))
    await sub.subscribe(f"{tag}/+/a", 1)
    await sub.subscribe(f"{tag}/b/#", 1)
    pub = await c.connect(b, ConnectSpec(f"{tag}-p"))
    for topic in ("x/a", "x/b", "b", "b/c/d", "y/a/z", "end/a"):
        await pub.publish(f"{tag}/{topic}", topic.encode(), 1)
    got = await sub.messages(4, WAIT_S)
    # in publish order: one publisher, one subscriber, one QoS (MQTT 4.6)
    assert [m.topic for m in got] == [f"{tag}/{t}" for t in ("x/a", "b", "b/c/d", "end/a")]
    await pub.end()
    await sub.end()
    return None


def burst(qos: int) -> Scenario:
    async def run(c: Client, b: Broker, tag: str) -> str | None:
        topic = f"{tag}/burst"
        sub = await c.connect(b, ConnectSpec(f"{tag}-s"))
        await sub.subscribe(topic, qos)
        pub = await c.connect(b, ConnectSpec(f"{tag}-p"))
        sent = await pub.burst(topic, BURST, qos)
        # A QoS 2 message past the broker's bound on those awaiting PUBREL may be
        # refused (0x97): the client is told, nothing is lost without a word.
        assert set(sent.failures) <= ({REFUSED} if qos == 2 else set()), sent.failures
        acked = [b"%d" % i for i, r in enumerate(sent.results) if r is None]
        got = await sub.messages(len(acked), WAIT_S)
        assert len(got) == len(acked), f"{len(got)} of {len(acked)} acknowledged received"
        assert [m.payload for m in got] == acked, "out of order"
        await pub.publish(topic, b"end", qos)  # the barrier: nothing refused came
        assert [m.payload for m in await sub.messages(1, WAIT_S)] == [b"end"]
        assert await pub.disconnects() == 0, "publisher disconnected"
        await pub.end()
        await sub.end()
        if sent.acked < BURST:
            return f"{sent.acked} of {BURST} acked, {BURST - sent.acked} refused 0x97"
        return None

    run.__name__ = f"burst_qos{qos}"
    return run


async def retained(c: Client, b: Broker, tag: str) -> str | None:
    topic = f"{tag}/r"
    pub = await c.connect(b, ConnectSpec(f"{tag}-p"))
    await pub.publish(topic, b"kept", 1, retain=True)
    first = await c.connect(b, ConnectSpec(f"{tag}-s1"))
    await first.subscribe(topic, 1)
    [got] = await first.messages(1, WAIT_S)
    assert (got.payload, got.retain) == (b"kept", True)
    await pub.publish(topic, b"", 1, retain=True)  # clears it
    second = await c.connect(b, ConnectSpec(f"{tag}-s2"))
    await second.subscribe(topic, 1)
    await pub.publish(topic, b"after", 1)  # the barrier: nothing retained came before it
    [after] = await second.messages(1, WAIT_S)
    assert (after.payload, after.retain) == (b"after", False)
    for conn in (pub, first, second):
        await conn.end()
    return None


async def will(c: Client, b: Broker, tag: str) -> str | None:
    watcher = await c.connect(b, ConnectSpec(f"{tag}-w"))
    await watcher.subscribe(f"{tag}/will", 1)
    victim = await c.connect(b, ConnectSpec(f"{tag}-v", will=Will(f"{tag}/will", b"gone")))
    await victim.drop()
    [got] = await watcher.messages(1, WAIT_S)
    assert (got.topic, got.payload) == (f"{tag}/will", b"gone")
    await watcher.end()
    return None


async def session_resume(c: Client, b: Broker, tag: str) -> str | None:
    spec = ConnectSpec(f"{tag}-s", clean=False, session_expiry=300)
    first = await c.connect(b, spec)  # a new client id: no session to resume yet
    assert first.session_present in (False, None)
    await first.subscribe(f"{tag}/q", 1)
    await first.end()
    pub = await c.connect(b, ConnectSpec(f"{tag}-p"))
    for i in range(QUEUED):
        await pub.publish(f"{tag}/q", b"%d" % i, 1)
    again = await c.connect(b, spec)
    assert again.session_present in (True, None)
    got = await again.messages(QUEUED, WAIT_S)
    assert [m.payload for m in got] == [b"%d" % i for i in range(QUEUED)]
    await pub.end()
    await again.end()
    clean = await c.connect(b, ConnectSpec(f"{tag}-s", clean=True))  # leaves no session behind
    await clean.end()
    return None


async def shared_subscription(c: Client, b: Broker, tag: str) -> str | None:
    group = f"$share/g{tag.replace('-', '')}/{tag}/job"
    members = [await c.connect(b, ConnectSpec(f"{tag}-m{i}")) for i in (1, 2)]
    for m in members:
        await m.subscribe(group, 1)
    pub = await c.connect(b, ConnectSpec(f"{tag}-p"))
    sent = await pub.burst(f"{tag}/job", SHARED_COUNT, 1)
    assert sent.acked == SHARED_COUNT, sent
    got: list[list[bytes]] = [[], []]
    while sum(map(len, got)) < SHARED_COUNT:
        before = sum(map(len, got))
        for i, m in enumerate(members):
            got[i] += [x.payload for x in await m.messages(SHARED_COUNT, 0.2)]
        if sum(map(len, got)) == before:
            break
    every = sorted(got[0] + got[1], key=int)
    assert every == [b"%d" % i for i in range(SHARED_COUNT)], "not each message once"
    assert got[0] and got[1], f"one member got everything: {list(map(len, got))}"
    for conn in (*members, pub):
        await conn.end()
    return None


async def v5_properties(c: Client, b: Broker, tag: str) -> str | None:
    sub = await c.connect(b, ConnectSpec(f"{tag}-s", version=5))
    await sub.subscribe(f"{tag}/#", 1)
    pub = await c.connect(b, ConnectSpec(f"{tag}-p", version=5))
    props = Props(
        user_properties=(("app", "interop"), ("k", "v")),
        message_expiry=60,
        response_topic=f"{tag}/reply",
        correlation_data=b"corr-1234",  # text: mosquitto_pub takes it as an argument
        content_type="text/plain",
    )
    await pub.publish(f"{tag}/req", b"ask", 1, props=props)
    [req] = await sub.messages(1, WAIT_S)
    got = req.props
    assert sorted(got.user_properties) == [("app", "interop"), ("k", "v")]
    assert (got.response_topic, got.correlation_data) == (f"{tag}/reply", b"corr-1234")
    assert got.content_type == "text/plain"
    assert got.message_expiry is not None and 0 < got.message_expiry <= 60
    await pub.end()
    await sub.end()
    return None


async def topic_alias(c: Client, b: Broker, tag: str) -> str | None:
    """A 5.0 PUBLISH that sets topic alias 1, then one that names its topic by it alone."""
    sub = await c.connect(b, ConnectSpec(f"{tag}-s", version=5))
    await sub.subscribe(f"{tag}/#", 1)
    pub = await c.connect(b, ConnectSpec(f"{tag}-p", version=5))
    await pub.publish(f"{tag}/alias", b"a1", 1, props=Props(topic_alias=1))
    await pub.publish("", b"a2", 1, props=Props(topic_alias=1))
    got = await sub.messages(2, WAIT_S)
    assert [(m.topic, m.payload) for m in got] == [(f"{tag}/alias", b"a1"), (f"{tag}/alias", b"a2")]
    await pub.end()
    await sub.end()
    return None


def over(transport: str) -> Scenario:
    async def run(c: Client, b: Broker, tag: str) -> str | None:
        sub = await c.connect(b, ConnectSpec(f"{tag}-s", transport=transport))
        await sub.subscribe(f"{tag}/t", 1)
        pub = await c.connect(b, ConnectSpec(f"{tag}-p", transport=transport))
        await pub.publish(f"{tag}/t", b"over " + transport.encode(), 1)
        [got] = await sub.messages(1, WAIT_S)
        assert got.payload == b"over " + transport.encode()
        await pub.end()
        await sub.end()
        return None

    run.__name__ = transport
    return run


SCENARIOS: dict[str, Scenario] = {
    "connect_v311": connect_v311,
    "connect_v5": connect_v5,
    "wildcards": wildcards,
    "burst_qos0": burst(0),
    "burst_qos1": burst(1),
    "burst_qos2": burst(2),
    "retained": retained,
    "will": will,
    "session_resume": session_resume,
    "shared_subscription": shared_subscription,
    "v5_properties": v5_properties,
    "topic_alias": topic_alias,
    "tls": over("tls"),
    "websocket": over("ws"),
}

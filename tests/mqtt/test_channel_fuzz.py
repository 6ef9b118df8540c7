"""Channel invariants under arbitrary client behaviour (Hypothesis).

Whatever a client sends, and whatever order the node answers in, the channel
never raises, emits at most one Close and nothing after it, and keeps a 5.0
client's unacknowledged inbound messages within the Receive Maximum: with
`strict_receive_maximum` by refusing past it, by default because a node that
reads nothing while `inbound_full` never has more routes in progress.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from services.mqtt.actions import Action, Close, Route, SubscribeRequest, UnsubscribeRequest
from services.mqtt.channel import Channel, State
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import (
    Disconnect,
    Message,
    Packet,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Subscription,
    Unsubscribe,
)
from tests.support.channel import NOW, make_connect

CFG = ChannelConfig(receive_maximum=3, topic_alias_maximum=2, max_qos=2)
STRICT = replace(CFG, strict_receive_maximum=True)

pids = st.integers(1, 4)
topics = st.sampled_from(["a", "a/b", "", "$SYS/x", "a/+", "#"])
aliases = st.one_of(st.none(), st.integers(0, 3))
publishes = st.builds(
    lambda topic, qos, pid, alias, dup: Publish(
        topic,
        b"x",
        qos=qos,
        dup=dup and qos > 0,
        packet_id=pid if qos else None,
        properties=Properties(topic_alias=alias),
    ),
    topics,
    st.integers(0, 2),
    pids,
    aliases,
    st.booleans(),
)
client_packets: st.SearchStrategy[Packet] = st.one_of(
    publishes,
    st.builds(Puback, pids),
    st.builds(Pubrec, pids, st.sampled_from([0, 0x80])),
    st.builds(Pubrel, pids),
    st.builds(Pubcomp, pids),
    st.builds(
        lambda pid, f, nl: Subscribe(pid, (Subscription(f, 1, no_local=nl),)),
        pids,
        st.sampled_from(["a/#", "$share/g/a", "a/#/b"]),
        st.booleans(),
    ),
    st.builds(lambda pid, f: Unsubscribe(pid, (f,)), pids, st.sampled_from(["a", "+/+", "#/a"])),
    st.just(Pingreq()),
    st.builds(Disconnect, st.sampled_from([0, 4])),
)
node_events = st.one_of(
    st.tuples(st.just("routed"), st.booleans(), st.booleans()),
    st.tuples(st.just("deliver"), st.integers(0, 2), pids),
    st.tuples(st.just("answer"), st.booleans(), st.booleans()),
    st.tuples(st.just("timer"), st.booleans(), st.booleans()),
)
steps = st.lists(st.one_of(client_packets.map(lambda p: ("packet", p)), node_events), max_size=40)


@settings(max_examples=300, deadline=None)
@given(level=st.sampled_from([3, 4, 5]), strict=st.booleans(), script=steps)
def test_channel_never_raises_and_closes_once(
    level: int, strict: bool, script: list[tuple[object, ...]]
) -> None:
    ch = Channel(STRICT if strict else CFG, "n", new_client_id=lambda: "gen", wall_ms=lambda: 0)
    log: list[Action] = list(ch.receive(make_connect(level, keep_alive=5), NOW))
    log += ch.session_opened(False)
    tokens: list[int] = []
    subs: list[int] = []
    unsubs: list[int] = []
    now = NOW
    for step in script:
        now += 1
        if step[0] == "packet" and ch.inbound_full:
            continue  # the node reads nothing from a full client
        if step[0] == "packet":
            packet = step[1]
            assert not isinstance(packet, (bool, int, str))
            acts = ch.receive(packet, now)  # type: ignore[arg-type]
        elif step[0] == "routed":
            acts = ch.routed(tokens.pop(0), bool(step[1]), bool(step[2])) if tokens else []
        elif step[0] == "deliver":
            qos = int(step[1])  # type: ignore[call-overload]
            pid = int(step[2]) if qos else None  # type: ignore[call-overload]
            acts = ch.deliver(Message("d", b"", qos=qos), pid, False, 0)
        elif step[0] == "answer":
            acts = []
            if subs and step[1]:
                acts += ch.subscribed(subs.pop(0), [1])
            if unsubs and step[2]:
                acts += ch.unsubscribed(unsubs.pop(0), [0])
        else:
            acts = ch.timer("keepalive", now + 100 if step[1] else now)
        for action in acts:
            if isinstance(action, Route) and action.token is not None:
                tokens.append(action.token)
            elif isinstance(action, SubscribeRequest):
                subs.append(action.packet_id)
            elif isinstance(action, UnsubscribeRequest):
                unsubs.append(action.packet_id)
        log += acts
        if level == 5 and ch.state is State.CONNECTED:
            if strict:
                assert ch.inbound_inflight <= CFG.receive_maximum
            assert len(tokens) <= CFG.receive_maximum
    closes = [i for i, a in enumerate(log) if isinstance(a, Close)]
    assert len(closes) <= 1
    if closes:
        assert closes[0] == len(log) - 1
        assert ch.state is State.CLOSED

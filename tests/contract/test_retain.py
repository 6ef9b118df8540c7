"""RetainStore contract, run over every implementation (today: node memory)."""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.mqtt.errors import TopicFilterInvalid, TopicNameInvalid
from services.mqtt.packets import Message
from services.mqtt.topics import matches
from services.retain.api import RetainStore
from services.retain.store import MemoryRetainStore
from tests.support.cost import lines_run

NOW = 1_700_000_000_000
IMPLEMENTATIONS = {"memory": MemoryRetainStore}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def store(request: pytest.FixtureRequest) -> RetainStore:
    s: RetainStore = IMPLEMENTATIONS[request.param]()
    return s


def msg(topic: str, payload: bytes = b"x", expires_at_ms: int | None = None) -> Message:
    return Message(topic, payload, qos=1, retain=True, expires_at_ms=expires_at_ms)


def topics_of(messages: list[Message]) -> list[str]:
    return sorted(m.topic for m in messages)


def test_set_get_replace_clear(store: RetainStore) -> None:
    assert store.get("a/b", NOW) is None
    store.set(msg("a/b", b"1"), NOW)
    store.set(msg("a/b", b"2"), NOW)
    got = store.get("a/b", NOW)
    assert got is not None
    assert got.payload == b"2"
    assert len(store) == 1
    assert store.clear("a/b")
    assert not store.clear("a/b")
    assert store.get("a/b", NOW) is None
    assert len(store) == 0


def test_empty_payload_clears(store: RetainStore) -> None:
    store.set(msg("a/b"), NOW)
    store.set(msg("a"), NOW)
    store.set(msg("a/b", b""), NOW)
    assert store.get("a/b", NOW) is None
    assert store.get("a", NOW) is not None
    assert len(store) == 1
    store.set(msg("never/set", b""), NOW)
    assert len(store) == 1


def test_match_wildcards(store: RetainStore) -> None:
    for topic in ["a", "a/b", "a/c", "a/b/c", "b/b", "/x", "a//b"]:
        store.set(msg(topic), NOW)
    assert topics_of(store.match("a/#", NOW)) == ["a", "a//b", "a/b", "a/b/c", "a/c"]
    assert topics_of(store.match("a/+", NOW)) == ["a/b", "a/c"]
    assert topics_of(store.match("+/b", NOW)) == ["a/b", "b/b"]
    assert topics_of(store.match("a/+/b", NOW)) == ["a//b"]
    assert topics_of(store.match("+/x", NOW)) == ["/x"]
    assert topics_of(store.match("a/b", NOW)) == ["a/b"]
    assert store.match("a/b/c/d", NOW) == []
    assert store.match("z/#", NOW) == []
    assert len(store.match("#", NOW)) == 7


def test_dollar_topics_need_an_explicit_first_level(store: RetainStore) -> None:
    store.set(msg("$SYS/broker/uptime"), NOW)
    store.set(msg("x/y"), NOW)
    assert topics_of(store.match("#", NOW)) == ["x/y"]
    assert topics_of(store.match("+/broker/+", NOW)) == []
    assert topics_of(store.match("$SYS/#", NOW)) == ["$SYS/broker/uptime"]
    assert topics_of(store.match("$SYS/+/uptime", NOW)) == ["$SYS/broker/uptime"]


def test_shared_filters_get_no_retained(store: RetainStore) -> None:
    store.set(msg("a/b"), NOW)
    assert store.match("$share/g/a/b", NOW) == []
    assert store.match("$share/g/#", NOW) == []


def test_invalid_inputs(store: RetainStore) -> None:
    with pytest.raises(TopicNameInvalid):
        store.set(msg("a/+"), NOW)
    with pytest.raises(TopicNameInvalid):
        store.set(msg(""), NOW)
    for bad in ["a/#/b", "", "a+", "$share/g"]:
        with pytest.raises(TopicFilterInvalid):
            store.match(bad, NOW)
    assert len(store) == 0


def test_expired_messages_are_not_returned(store: RetainStore) -> None:
    store.set(msg("a/short", expires_at_ms=NOW + 10), NOW)
    store.set(msg("a/long", expires_at_ms=NOW + 10_000), NOW)
    store.set(msg("a/never"), NOW)
    assert topics_of(store.match("a/#", NOW)) == ["a/long", "a/never", "a/short"]
    assert store.get("a/short", NOW + 9) is not None
    assert store.get("a/short", NOW + 10) is None
    assert topics_of(store.match("a/#", NOW + 10)) == ["a/long", "a/never"]
    assert topics_of(store.match("a/+", NOW + 10_000)) == ["a/never"]
    assert len(store) == 1


def test_expired_set_replaces_older_message(store: RetainStore) -> None:
    store.set(msg("a", b"old"), NOW)
    store.set(msg("a", b"new", expires_at_ms=NOW - 1), NOW)
    assert store.get("a", NOW) is None
    assert len(store) == 0


def test_purge_expired(store: RetainStore) -> None:
    for i in range(10):
        store.set(msg(f"t/{i}", expires_at_ms=NOW + 1 + i), NOW)
    assert len(store) == 10
    assert store.purge_expired(NOW + 5) == 5
    assert len(store) == 5
    assert store.purge_expired(NOW + 5) == 0
    assert topics_of(store.match("t/#", NOW + 5)) == ["t/5", "t/6", "t/7", "t/8", "t/9"]


def test_default_clock_is_wall_time(store: RetainStore) -> None:
    store.set(msg("past", expires_at_ms=1))
    store.set(msg("future", expires_at_ms=2**62))
    assert store.get("past") is None
    assert store.get("future") is not None
    assert topics_of(store.match("#")) == ["future"]


def test_match_cost_follows_matching_branches_not_store_size() -> None:
    """A wildcard match runs the same lines in a store 100 times larger (the
    timings: bench/matchcost.py)."""
    lines = {}
    for n in (200, 20_000):
        store = MemoryRetainStore()
        for i in range(n):
            store.set(msg(f"dev/{i}/state"), NOW)
        store.set(msg("hot/one"), NOW)
        assert topics_of(store.match("hot/+", NOW)) == ["hot/one"]
        assert topics_of(store.match("dev/17/#", NOW)) == ["dev/17/state"]
        lines[n] = tuple(lines_run(partial(store.match, f, NOW)) for f in ("hot/+", "dev/17/#"))
    assert lines[20_000] == lines[200]


TOPIC_LEVELS = ["a", "b", "", "$s"]
FILTER_LEVELS = ["a", "b", "", "$s", "+"]
topic_names = (
    st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)
)


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(FILTER_LEVELS), min_size=0, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "+"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(topic_names, st.sampled_from([b"", b"p", b"q"]), st.sampled_from([None, 5, 50])),
        max_size=40,
    ),
    st.lists(topic_filters(), min_size=1, max_size=6),
    st.sampled_from([0, 10, 100]),
)
def test_match_equals_brute_force(
    writes: list[tuple[str, bytes, int | None]], filters: list[str], later: int
) -> None:
    for factory in IMPLEMENTATIONS.values():
        store: RetainStore = factory()
        model: dict[str, Message] = {}
        for topic, payload, ttl in writes:
            m = msg(topic, payload, None if ttl is None else NOW + ttl)
            store.set(m, NOW)
            if payload:
                model[topic] = m
            else:
                model.pop(topic, None)
        assert len(store) == len(model)
        now = NOW + later
        live = {t: m for t, m in model.items() if m.expires_at_ms is None or m.expires_at_ms > now}
        for f in filters:
            expected = sorted((m.topic, m.payload) for t, m in live.items() if matches(f, t))
            assert sorted((m.topic, m.payload) for m in store.match(f, now)) == expected, f
        for topic in model:
            assert store.get(topic, now) == live.get(topic)
        store.purge_expired(now)
        assert len(store) == len(live)
        for topic in list(live):
            assert store.clear(topic)
        assert len(store) == 0
        if isinstance(store, MemoryRetainStore):
            assert store._root.children is None

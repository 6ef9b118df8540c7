"""The subscription trie against the brute-force matcher of services.mqtt.topics."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.topics import matches, parse_shared
from services.mqtt.trie import TopicTrie
from tests.support.cost import lines_run

TOPIC_LEVELS = ["a", "b", "", "$s", "$share", "g"]
FILTER_LEVELS = ["a", "b", "", "$s", "+", "g"]

topics = st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(FILTER_LEVELS), min_size=0, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    if not levels:
        levels = ["#"]
    plain = "/".join(levels)
    if not plain:
        plain = "+"
    if draw(st.integers(0, 3)) == 0:
        return f"$share/{draw(st.sampled_from(['g1', 'g2']))}/{plain}"
    return plain


keys = st.sampled_from(["c1", "c2", "c3", "c4"])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), filters(), keys, st.integers(0, 9)),
        # add_many: filters joined by newlines (which no filter holds)
        st.tuples(
            st.just("add_many"),
            st.lists(filters(), max_size=4).map("\n".join),
            keys,
            st.integers(0, 9),
        ),
        st.tuples(st.just("remove"), filters(), keys, st.just(0)),
        st.tuples(st.just("match"), topics, st.just(""), st.just(0)),
        st.tuples(st.just("remove_key"), st.just(""), keys, st.just(0)),
    ),
    max_size=60,
)

Model = dict[tuple[str, str], int]


def expected_match(model: Model, topic: str) -> list[tuple[str, int]]:
    return sorted(
        (k, v) for (f, k), v in model.items() if parse_shared(f) is None and matches(f, topic)
    )


def expected_shared(model: Model, topic: str) -> dict[tuple[str, str], list[tuple[str, int]]]:
    out: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for (f, k), v in model.items():
        shared = parse_shared(f)
        if shared is not None and matches(f, topic):
            out.setdefault(shared, []).append((k, v))
    return {gf: sorted(members) for gf, members in out.items()}


def check(trie: TopicTrie[int], model: Model, topic: str) -> None:
    assert sorted(trie.match(topic)) == expected_match(model, topic), topic
    got = {gf: sorted(m) for gf, m in trie.match_shared(topic).items()}
    assert got == expected_shared(model, topic), topic


@settings(max_examples=400, deadline=None)
@given(ops, st.lists(topics, min_size=1, max_size=8), st.sampled_from([0, 2, 4096]), st.booleans())
def test_trie_equals_brute_force(
    operations: list[tuple[str, str, str, int]], probes: list[str], cache_size: int, index: bool
) -> None:
    trie: TopicTrie[int] = TopicTrie(cache_size=cache_size, index_keys=index)
    if not index:
        operations = [o for o in operations if o[0] != "remove_key"]
    model: Model = {}
    for op, text, key, value in operations:
        if op == "add":
            assert trie.add(text, key, value) is ((text, key) not in model)
            model[(text, key)] = value
        elif op == "add_many":
            batch = text.split("\n") if text else []
            assert trie.add_many(key, [(f, value) for f in batch]) == len(
                {f for f in batch if (f, key) not in model}
            )
            model.update(((f, key), value) for f in batch)
        elif op == "remove":
            assert trie.remove(text, key) is ((text, key) in model)
            model.pop((text, key), None)
        elif op == "remove_key":
            held = [f for f, k in model if k == key]
            assert sorted(trie.remove_key(key)) == sorted(held)
            for f in held:
                del model[(f, key)]
        else:
            check(trie, model, text)
        assert len(trie) == len(model)
    for topic in probes:
        check(trie, model, topic)
    for key in ["c1", "c2", "c3", "c4"] if index else []:
        assert sorted(trie.filters(key)) == sorted(f for f, k in model if k == key)
    for f, k in list(model):
        assert trie.remove(f, k)
    assert len(trie) == 0
    assert trie._root.is_empty()
    assert trie._exact == {}
    if index:
        assert list(trie.keys()) == []


def test_add_replaces_value_and_match_sees_it() -> None:
    trie: TopicTrie[str] = TopicTrie()
    assert trie.add("a/+", "c1", "qos0")
    assert trie.match("a/b") == [("c1", "qos0")]
    assert not trie.add("a/+", "c1", "qos1")
    assert trie.match("a/b") == [("c1", "qos1")]
    assert len(trie) == 1


def test_one_key_may_match_through_several_filters() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a/b", "c1", 1)
    trie.add("a/+", "c1", 2)
    trie.add("#", "c1", 3)
    assert sorted(trie.match("a/b")) == [("c1", 1), ("c1", 2), ("c1", 3)]


def test_dollar_topics_skip_first_level_wildcards() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("#", "all", 0)
    trie.add("+/x", "plus", 0)
    trie.add("$SYS/#", "sys", 0)
    trie.add("$share/g/#", "shared", 0)
    assert trie.match("$SYS/x") == [("sys", 0)]
    assert trie.match_shared("$SYS/x") == {}
    assert sorted(trie.match("a/x")) == [("all", 0), ("plus", 0)]
    assert trie.match_shared("a/x") == {("g", "#"): [("shared", 0)]}


def test_shared_groups_are_separate_from_plain() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("$share/g1/a/+", "c1", 1)
    trie.add("$share/g1/a/+", "c2", 1)
    trie.add("$share/g2/a/+", "c3", 1)
    trie.add("a/+", "c4", 1)
    assert trie.match("a/b") == [("c4", 1)]
    shared = trie.match_shared("a/b")
    assert sorted(shared) == [("g1", "a/+"), ("g2", "a/+")]
    assert sorted(shared[("g1", "a/+")]) == [("c1", 1), ("c2", 1)]
    assert trie.filters("c1") == ["$share/g1/a/+"]


def test_invalid_filters_are_rejected() -> None:
    trie: TopicTrie[int] = TopicTrie()
    for bad in ["", "a/#/b", "a+", "$share/g", "$share//a"]:
        with pytest.raises(TopicFilterInvalid):
            trie.add(bad, "c1", 0)
        assert not trie.remove(bad, "c1")
    assert len(trie) == 0


def test_add_many_stops_at_an_invalid_filter_keeping_what_it_added() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("q/#", "c0", 0)
    assert trie.match("x/1") == []  # the walk is cached: no node reaches x/1
    with pytest.raises(TopicFilterInvalid):
        trie.add_many("c1", [("x/+", 1), ("y", 2), ("a/#/b", 3), ("z", 4)])
    assert len(trie) == 3
    assert trie.filters("c1") == ["x/+", "y"]
    assert trie.match("x/1") == [("c1", 1)]  # the new node voided the cached walk
    assert trie.add_many("c1", [("x/+", 5), ("$share/g/x/+", 6)], checked=True) == 1
    assert trie.match("x/1") == [("c1", 5)]
    assert trie.match_shared("x/1") == {("g", "x/+"): [("c1", 6)]}


def test_remove_key_and_pruning() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a/b/c", "c1", 0)
    trie.add("a/b/#", "c1", 0)
    trie.add("$share/g/a/b", "c1", 0)
    trie.add("a/b/c", "c2", 0)
    assert trie.remove_key("c1") == ["a/b/c", "a/b/#", "$share/g/a/b"]
    assert trie.filters("c1") == []
    assert trie.match("a/b/c") == [("c2", 0)]
    assert trie.remove("a/b/c", "c2")
    assert not trie.remove("a/b/c", "c2")
    assert trie._root.is_empty()
    assert trie._exact == {}


def test_churn_does_not_grow_the_trie() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("keep/+", "k", 0)
    for i in range(2000):
        f = f"dev/{i}/cmd/#"
        trie.add(f, f"c{i}", 0)
        assert trie.match(f"dev/{i}/cmd/x") == [(f"c{i}", 0)]
        assert trie.remove(f, f"c{i}")
    root_children = trie._root.children
    assert root_children is not None
    assert list(root_children) == ["keep"]
    assert trie._root.plus is None and trie._root.hash is None
    assert len(trie._cache) <= 4096


def test_cache_sees_new_subscribers_at_existing_nodes() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a/b", "c1", 0)
    assert trie.match("a/b") == [("c1", 0)]
    trie.add("a/b", "c2", 0)
    assert sorted(trie.match("a/b")) == [("c1", 0), ("c2", 0)]
    trie.add("a/#", "c3", 0)
    assert sorted(trie.match("a/b")) == [("c1", 0), ("c2", 0), ("c3", 0)]
    trie.remove("a/b", "c1")
    trie.remove("a/b", "c2")
    assert trie.match("a/b") == [("c3", 0)]
    trie.add("a/b", "c1", 5)
    assert sorted(trie.match("a/b")) == [("c1", 5), ("c3", 0)]


def test_match_returns_a_fresh_list() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a", "c1", 0)
    first = trie.match("a")
    first.append(("x", 1))
    assert trie.match("a") == [("c1", 0)]


def test_match_cost_does_not_grow_with_unrelated_subscriptions() -> None:
    """A match runs the same lines in a trie 500 times larger (the timings:
    bench/matchcost.py)."""
    small: TopicTrie[int] = TopicTrie(cache_size=0)
    big: TopicTrie[int] = TopicTrie(cache_size=0)
    for trie, n in ((small, 100), (big, 50_000)):
        for i in range(n):
            trie.add(f"dev/{i}/state", f"c{i}", 0)
            trie.add(f"other/{i}/+", f"c{i}", 0)
        trie.add("dev/+/state", "watcher", 0)
    for topic in ("dev/0/state", "dev/57/state", "dev/99/state"):
        assert sorted(big.match(topic)) == sorted(small.match(topic))
        assert len(small.match(topic)) == 2
        assert lines_run(lambda t=topic: big.match(t)) == lines_run(lambda t=topic: small.match(t))


def test_memory_per_subscription_stays_small() -> None:
    """100k subscriptions over 10k clients, mostly per-client filters: the
    shape whose 1M/100k version the node must hold (measured ~280 B/entry)."""
    filters_per_client = 10
    clients = [f"client-{i:06d}" for i in range(10_000)]
    options = object()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        trie: TopicTrie[object] = TopicTrie()
        for ci, cid in enumerate(clients):
            for j in range(filters_per_client):
                if j < 6:
                    f = f"devices/{cid}/cmd/{j}"
                elif j == 6:
                    f = f"devices/{cid}/+/reply"
                elif j == 7:
                    f = f"tenant/{ci % 1000}/+/status"
                elif j == 8:
                    f = f"sensors/{(ci * 7 + j) % 10_000}/#"
                else:
                    f = f"$share/g{ci % 10}/jobs/{ci % 100}/#"
                trie.add(f, cid, options)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(trie) == 100_000
    assert used / len(trie) < 400, used / len(trie)
    assert trie.match(f"devices/{clients[5]}/cmd/3") == [(clients[5], options)]


def test_without_key_index() -> None:
    trie: TopicTrie[int] = TopicTrie(index_keys=False)
    assert trie.add("a/+", "c1", 1)
    assert trie.add("a/b", "c1", 2)
    assert sorted(trie.match("a/b")) == [("c1", 1), ("c1", 2)]
    assert trie.remove("a/+", "c1")
    assert len(trie) == 1
    with pytest.raises(TypeError):
        trie.filters("c1")
    with pytest.raises(TypeError):
        trie.remove_key("c1")

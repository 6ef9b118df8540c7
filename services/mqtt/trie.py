"""The subscription trie: which (client, value) pairs a published topic reaches.

Theory of operation. Filters without wildcards live in a dict keyed by the
filter itself: matching them is one lookup of the topic. Wildcard filters
live in a trie, one node per level; a node keeps its `+` and `#` children in
their own slots and its other levels in a dict, and the node at the end of a
filter's path holds that filter's subscribers. Matching a topic walks its
levels with a set of live nodes: at each level a node hands on its child of
that name and its `+` child, and its `#` child matches right there. At the
end the live nodes match, and so do their `#` children (`a/#` matches `a`).
A topic that starts with `$` takes only the exact child at the first level.
The cost is the topic's depth times the number of live branches of the
wildcard trie, independent of how many subscriptions there are.

Entries. A filter's non-shared subscribers are held inline while there is
one (`one`, the common case for per-client filters) and in a dict keyed by
client id from the second on; each is stored as the ready-made `(key,
value)` tuple that `match` returns, so matching allocates only the result
list. Shared subscriptions (`$share/g/f`) are kept with `f` under `(g, f)`.
Removing the last entry of a filter drops it and prunes every emptied
ancestor node, so memory follows the live subscriptions, not churn.

Cache. `match` remembers, per topic, the list of trie nodes the walk reached
(a bounded dict, emptied when full: FIFO eviction from a dict rescans deleted
slots and costs more than it saves). Entries are read from those nodes at
match time, so adding or removing a subscriber of an existing node needs no
invalidation; creating a node clears the cache (the walk could now reach
it). A pruned node left in a cached list is empty forever and contributes
nothing. Exact filters are looked up afresh on every match.

Precondition: `match` takes a valid topic name (no wildcards); the codec and
channel validate names before routing. `add` validates filters. `add_many`
is `add` for one key's filters in one call (a node start loads a million
subscriptions client by client); `add` is its one-filter case.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.topics import parse_shared, validate_topic_filter

V = TypeVar("V")

DEFAULT_CACHE_SIZE = 4096  # topics; a hot set of topics fits, a bound keeps memory flat


_NO_NODES: list[_Node[Any]] = []  # never mutated


class _Entries(Generic[V]):
    """The subscribers of one filter (non-shared and shared)."""

    __slots__ = ("one", "shared", "subs")

    def __init__(self) -> None:
        self.one: tuple[str, V] | None = None
        self.subs: dict[str, tuple[str, V]] | None = None
        self.shared: dict[tuple[str, str], dict[str, tuple[str, V]]] | None = None

    def is_empty(self) -> bool:
        return self.one is None and self.subs is None and self.shared is None

    def put(self, entry: tuple[str, V]) -> bool:
        key = entry[0]
        one = self.one
        if one is not None:
            if one[0] == key:
                self.one = entry
                return False
            self.subs = {one[0]: one, key: entry}
            self.one = None
            return True
        subs = self.subs
        if subs is None:
            self.one = entry
            return True
        new = key not in subs
        subs[key] = entry
        return new

    def drop(self, key: str) -> bool:
        one = self.one
        if one is not None:
            if one[0] != key:
                return False
            self.one = None
            return True
        subs = self.subs
        if subs is None or subs.pop(key, None) is None:
            return False
        if len(subs) == 1:
            self.one = next(iter(subs.values()))
            self.subs = None
        return True

    def put_shared(self, group_filter: tuple[str, str], entry: tuple[str, V]) -> bool:
        shared = self.shared
        if shared is None:
            shared = self.shared = {}
        members = shared.get(group_filter)
        if members is None:
            shared[group_filter] = {entry[0]: entry}
            return True
        new = entry[0] not in members
        members[entry[0]] = entry
        return new

    def drop_shared(self, group_filter: tuple[str, str], key: str) -> bool:
        shared = self.shared
        if shared is None:
            return False
        members = shared.get(group_filter)
        if members is None or members.pop(key, None) is None:
            return False
        if not members:
            del shared[group_filter]
            if not shared:
                self.shared = None
        return True


class _Node(_Entries[V]):
    """A trie node: the entries of the wildcard filter ending here, and children."""

    __slots__ = ("children", "hash", "plus")

    def __init__(self) -> None:  # _Entries' slots set here: a million nodes skip the super() call
        self.one: tuple[str, V] | None = None
        self.subs: dict[str, tuple[str, V]] | None = None
        self.shared: dict[tuple[str, str], dict[str, tuple[str, V]]] | None = None
        self.children: dict[str, _Node[V]] | None = None  # exact levels only
        self.plus: _Node[V] | None = None
        self.hash: _Node[V] | None = None

    def is_empty(self) -> bool:
        return (
            self.one is None
            and self.subs is None
            and self.shared is None
            and self.children is None
            and self.plus is None
            and self.hash is None
        )

    def child(self, level: str) -> _Node[V] | None:
        if level == "+":
            return self.plus
        if level == "#":
            return self.hash
        children = self.children
        return None if children is None else children.get(level)

    def drop_child(self, level: str) -> None:
        if level == "+":
            self.plus = None
        elif level == "#":
            self.hash = None
        else:
            children = self.children
            assert children is not None
            del children[level]
            if not children:
                self.children = None


class TopicTrie(Generic[V]):
    """Subscriptions by topic filter; `key` is a client id, `value` its options.

    `index_keys` keeps, per key, the filters it holds (for `filters`,
    `remove_key`, `keys`); it costs about a fifth of the trie's memory, so
    a caller that already tracks each client's filters can turn it off.
    """

    __slots__ = ("_by_key", "_cache", "_cache_size", "_count", "_exact", "_root")

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE, index_keys: bool = True) -> None:
        self._root: _Node[V] = _Node()
        self._exact: dict[str, _Entries[V]] = {}
        self._count = 0
        self._by_key: dict[str, dict[str, None]] | None = {} if index_keys else None
        self._cache: dict[str, list[_Node[V]]] = {}
        self._cache_size = cache_size

    def __len__(self) -> int:
        return self._count

    def add(self, topic_filter: str, key: str, value: V, checked: bool = False) -> bool:
        """Subscribe `key` to `topic_filter` (plain or `$share/g/f`).

        True if the (filter, key) pair is new; otherwise its value is
        replaced and False is returned. Raises TopicFilterInvalid.
        `checked`: the filter was validated before (it comes from the event
        log, whose writers validated it at SUBSCRIBE), so a replay of a
        million subscriptions does not validate them again.
        """
        return self.add_many(key, ((topic_filter, value),), checked) == 1

    def add_many(self, key: str, entries: Iterable[tuple[str, V]], checked: bool = False) -> int:
        """`add(filter, key, value, checked)` for each (filter, value) of one
        key, in order; returns how many pairs were new. The bulk form a
        node start uses: one client's subscriptions in one call."""
        key = sys.intern(key)
        exact = self._exact
        by_key = self._by_key
        created = False
        new = 0
        held: dict[str, None] | None = None  # by_key[key], made at the first new pair
        entry: tuple[str, V] | None = None
        try:
            for topic_filter, value in entries:
                # parse_shared only for what may be shared (it raises for a bad `$share...`)
                shared = parse_shared(topic_filter) if topic_filter[:1] == "$" else None
                if shared is None:
                    if not checked:
                        validate_topic_filter(topic_filter)
                    path = topic_filter
                else:
                    path = shared[1]
                entries_: _Entries[V] | None
                if "+" in path or "#" in path:
                    entries_, made = self._path(path)
                    created = created or made
                else:
                    entries_ = exact.get(path)
                    if entries_ is None:
                        entries_ = exact[path] = _Entries()
                if entry is None or entry[1] is not value:  # one tuple per distinct value
                    entry = (key, value)
                if shared is not None:
                    if not entries_.put_shared(shared, entry):
                        continue
                elif entries_.one is None and entries_.subs is None:
                    entries_.one = entry  # put(entry) on an empty filter, inlined
                elif not entries_.put(entry):
                    continue
                new += 1
                if by_key is not None:
                    if held is None:
                        held = by_key.get(key)
                        if held is None:
                            held = by_key[key] = {}
                    held[topic_filter] = None
        finally:  # what was added counts, and a new node voids the cache, even on a raise
            if created:
                self._cache.clear()
            self._count += new
        return new

    def _path(self, path: str) -> tuple[_Node[V], bool]:
        """The node of wildcard filter `path`, made with its missing
        ancestors; True if any node was made. (`child`, inlined, and
        the making: a node start makes a million nodes.)"""
        node = self._root
        made = False
        for level in path.split("/"):
            if level == "+":
                child = node.plus
                if child is None:
                    child = node.plus = _Node()
                    made = True
            elif level == "#":
                child = node.hash
                if child is None:
                    child = node.hash = _Node()
                    made = True
            else:
                children = node.children
                if children is None:
                    children = node.children = {}
                child = children.get(level)
                if child is None:
                    child = children[sys.intern(level)] = _Node()
                    made = True
            node = child
        return node, made

    def remove(self, topic_filter: str, key: str) -> bool:
        """Unsubscribe; True if the (filter, key) pair existed. Prunes empty nodes."""
        try:
            shared = parse_shared(topic_filter)
        except TopicFilterInvalid:
            return False
        path = topic_filter if shared is None else shared[1]
        if "+" in path or "#" in path:
            return self._remove_wild(path, shared, key, topic_filter)
        entries = self._exact.get(path)
        if entries is None or not (
            entries.drop(key) if shared is None else entries.drop_shared(shared, key)
        ):
            return False
        if entries.is_empty():
            del self._exact[path]
        self._forget(topic_filter, key)
        return True

    def _remove_wild(
        self, path: str, shared: tuple[str, str] | None, key: str, topic_filter: str
    ) -> bool:
        trail: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in path.split("/"):
            child = node.child(level)
            if child is None:
                return False
            trail.append((node, level))
            node = child
        if not (node.drop(key) if shared is None else node.drop_shared(shared, key)):
            return False
        for parent, level in reversed(trail):
            if not node.is_empty():
                break
            parent.drop_child(level)
            node = parent
        self._forget(topic_filter, key)
        return True

    def _forget(self, topic_filter: str, key: str) -> None:
        self._count -= 1
        by_key = self._by_key
        if by_key is not None:
            held = by_key[key]
            del held[topic_filter]
            if not held:
                del by_key[key]

    def _index(self) -> dict[str, dict[str, None]]:
        if self._by_key is None:
            raise TypeError("this TopicTrie was built with index_keys=False")
        return self._by_key

    def remove_key(self, key: str) -> list[str]:
        """Remove every subscription of `key`; returns the filters it held."""
        held = list(self._index().get(key, ()))
        for topic_filter in held:
            self.remove(topic_filter, key)
        return held

    def filters(self, key: str) -> list[str]:
        """The filters `key` holds, in the order they were first added."""
        return list(self._index().get(key, ()))

    def keys(self) -> Iterator[str]:
        """Every key holding at least one subscription."""
        return iter(self._index())

    def match(self, topic: str) -> list[tuple[str, V]]:
        """Non-shared (key, value) pairs whose filter matches `topic`: one per
        matching (filter, key), so a key may appear several times. A fresh
        list the caller may keep; the tuples are shared, never mutated."""
        out: list[tuple[str, V]] = []
        exact = self._exact.get(topic)
        if exact is not None:
            if exact.one is not None:
                out.append(exact.one)
            elif exact.subs is not None:
                out.extend(exact.subs.values())
        nodes = self._cache.get(topic)
        if nodes is None:
            nodes = self._nodes(topic)
        for node in nodes:
            one = node.one
            if one is not None:
                out.append(one)
            elif node.subs is not None:
                out.extend(node.subs.values())
        return out

    def match_shared(self, topic: str) -> dict[tuple[str, str], list[tuple[str, V]]]:
        """(group, filter) -> its members, for each shared subscription
        whose filter matches `topic`. Picking one member is the caller's job."""
        out: dict[tuple[str, str], list[tuple[str, V]]] = {}
        exact = self._exact.get(topic)
        if exact is not None and exact.shared is not None:
            for group_filter, members in exact.shared.items():
                out[group_filter] = list(members.values())
        nodes = self._cache.get(topic)
        if nodes is None:
            nodes = self._nodes(topic)
        for node in nodes:
            shared = node.shared
            if shared is not None:
                for group_filter, members in shared.items():
                    out[group_filter] = list(members.values())
        return out

    def _nodes(self, topic: str) -> list[_Node[V]]:
        """The walk's result for `topic`, remembered (the caller tried the cache)."""
        root = self._root
        if root.children is None and root.plus is None and root.hash is None:
            return _NO_NODES
        nodes = self._walk(topic)
        cache = self._cache
        if self._cache_size > 0:
            if len(cache) >= self._cache_size:
                cache.clear()
            cache[topic] = nodes
        return nodes

    def _walk(self, topic: str) -> list[_Node[V]]:
        found: list[_Node[V]] = []
        levels = topic.split("/")
        live: list[_Node[V]]
        if topic[:1] == "$":
            children = self._root.children
            first = None if children is None else children.get(levels[0])
            if first is None:
                return found
            live = [first]
            levels = levels[1:]
        else:
            live = [self._root]
        for level in levels:
            nxt: list[_Node[V]] = []
            for node in live:
                child = node.hash
                if child is not None:
                    found.append(child)
                child = node.plus
                if child is not None:
                    nxt.append(child)
                children = node.children
                if children is not None:
                    child = children.get(level)
                    if child is not None:
                        nxt.append(child)
            if not nxt:
                return found
            live = nxt
        for node in live:
            found.append(node)
            child = node.hash
            if child is not None:
                found.append(child)
        return found

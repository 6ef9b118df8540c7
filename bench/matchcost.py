"""Match cost against unrelated state, in wall-clock time: `python -m bench.matchcost`.

The unit tests (tests/mqtt/test_trie.py, tests/contract/test_retain.py)
check the behaviour that makes matching independent of unrelated
subscriptions and retained topics: a match runs the same lines of Python
whatever else the trie or the store holds. Wall-clock ratios depend on the
machine and its load, so they are measured here: the time of a batch of
matches in a small and in a large trie (retained store), best of
`ROUNDS`, and their ratio (near 1 when the cost follows only the matching
branches; the bounds were 3 for the trie and 5 for the store when these
were unit tests). One JSON object on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from services.mqtt.packets import Message
from services.mqtt.trie import TopicTrie
from services.retain.store import MemoryRetainStore

ROUNDS = 3
NOW = 1_700_000_000_000  # ms: the retained store's clock, fixed so nothing expires
TRIE_SIZES = (100, 50_000)  # per-device subscriptions (each with an unrelated "other/<i>/+")
STORE_SIZES = (200, 20_000)  # retained topics "dev/<i>/state"


def best_of(work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def trie_cost(size: int, matches: int = 20_000) -> float:
    """Seconds for `matches` matches of 100 device topics in a trie of `size` devices."""
    trie: TopicTrie[int] = TopicTrie(cache_size=0)
    for i in range(size):
        trie.add(f"dev/{i}/state", f"c{i}", 0)
        trie.add(f"other/{i}/+", f"c{i}", 0)
    trie.add("dev/+/state", "watcher", 0)
    topics = [f"dev/{i % 100}/state" for i in range(matches)]
    return best_of(lambda: [trie.match(t) for t in topics])


def store_cost(size: int, matches: int = 2_000) -> float:
    """Seconds for `matches` pairs of wildcard matches in a store of `size` topics."""
    store = MemoryRetainStore()
    for i in range(size):
        store.set(Message(f"dev/{i}/state", b"x", qos=1, retain=True), NOW)
    store.set(Message("hot/one", b"x", qos=1, retain=True), NOW)

    def work() -> None:
        for _ in range(matches):
            store.match("hot/+", NOW)
            store.match("dev/17/#", NOW)

    return best_of(work)


def measure(trie_sizes: tuple[int, int] = TRIE_SIZES,
            store_sizes: tuple[int, int] = STORE_SIZES) -> dict[str, float]:  # fmt: skip
    small, big = (trie_cost(n) for n in trie_sizes)
    few, many = (store_cost(n) for n in store_sizes)
    return {
        "trie_small_s": round(small, 4),
        "trie_big_s": round(big, 4),
        "trie_ratio": round(big / small, 2),
        "retain_small_s": round(few, 4),
        "retain_big_s": round(many, 4),
        "retain_ratio": round(many / few, 2),
    }


def main() -> int:
    print(json.dumps(measure()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

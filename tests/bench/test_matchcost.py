from __future__ import annotations

from bench.matchcost import measure


def test_matchcost_reports_both_ratios() -> None:
    got = measure(trie_sizes=(10, 200), store_sizes=(10, 200))
    assert set(got) == {
        "trie_small_s", "trie_big_s", "trie_ratio", "retain_small_s", "retain_big_s",
        "retain_ratio",
    }  # fmt: skip
    assert all(v > 0 for v in got.values())

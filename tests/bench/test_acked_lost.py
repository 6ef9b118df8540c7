"""`acked_lost`: acknowledged messages a subscriber never received, from the tallies."""

from __future__ import annotations

import pickle
from collections.abc import Iterable

from bench.client import Tally
from bench.scenarios import PublishOutcome, acked_lost


def _tally(received: dict[int, Iterable[int]]) -> Tally:
    tally = Tally((0, 1), 10, latency=False)
    tally.record([(n, seq, 0) for n, seqs in received.items() for seq in seqs], 1)
    return tally


def test_a_missing_acknowledged_message_counts() -> None:
    # publisher 0: 8 acked, seq 3 missing; publisher 1: 5 acked, all in
    tally = _tally({0: [s for s in range(10) if s != 3], 1: range(7)})
    assert acked_lost([tally], {0: 8, 1: 5}) == 1


def test_missing_unacknowledged_messages_do_not_count() -> None:
    # 10 sent each; 6 and 4 acked; only seqs at or above the acked counts are missing
    tally = _tally({0: range(6), 1: range(5)})
    assert acked_lost([tally], {0: 6, 1: 4}) == 0
    assert acked_lost([tally], {0: 7, 1: 4}) == 1


def test_counts_per_subscriber_and_unknown_publishers_as_none_acked() -> None:
    full, empty = _tally({0: range(10), 1: range(10)}), _tally({})
    assert acked_lost([full, empty], {0: 10, 1: 2}) == 12
    assert acked_lost([empty], {}) == 0


def test_outcome_carries_acked_by_through_pickle() -> None:
    outcome = PublishOutcome(sent={0: 5}, acked=4, first_ns=1, last_ns=2, acked_by={0: 4})
    assert pickle.loads(pickle.dumps(outcome)).acked_by == {0: 4}

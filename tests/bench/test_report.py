from __future__ import annotations

import json

from bench.client import Tally
from bench.report import Result, comparison, latency_of, percentile


def test_nearest_rank_percentiles() -> None:
    values = list(range(1, 1001))
    assert percentile(values, 0.5) == 500
    assert percentile(values, 0.99) == 990
    assert percentile(values, 0.999) == 999
    assert percentile([7], 0.999) == 7
    latency = latency_of([2_000_000, 1_000_000, 3_000_000])
    assert latency is not None
    assert (latency.p50_ms, latency.max_ms, latency.samples) == (2.0, 3.0, 3)
    assert latency_of([]) is None


def test_tally_counts_losses_duplicates_and_strangers() -> None:
    tally = Tally((4, 9), 10, latency=True)
    tally.record([(4, 0, 0), (4, 1, 0), (9, 0, 100), (4, 1, 0)], now_ns=1_000)
    tally.record([(5, 0, 0), (9, 10, 0)], now_ns=2_000)
    assert tally.received == 4
    assert tally.duplicates == 1
    assert tally.unique == 3
    assert tally.unexpected == 2
    assert (tally.first_ns, tally.last_ns) == (1_000, 2_000)
    assert tally.latencies_ns == [900]


def _result(broker: str, rate: float) -> Result:
    return Result("pairs", 1, broker, 10, 10, 10, 0, 0, rate, 1.0, extra={"publishers": 100})


def test_result_line_is_flat_json_and_comparison_takes_median_ratio() -> None:
    line = json.loads(_result("a:1", 100.0).line())
    assert line["scenario"] == "pairs" and line["publishers"] == 100 and "extra" not in line
    ours = [_result("a:1", r) for r in (100.0, 300.0, 200.0)]
    peer = [_result("b:2", r) for r in (100.0, 100.0, 100.0)]
    summary = comparison(ours, peer)
    assert summary["throughput_ratio_median"] == 2.0
    assert (summary["ours"], summary["peer"], summary["rounds"]) == ("a:1", "b:2", 3)


def test_idle_comparison_uses_connect_rate_and_rss() -> None:
    def idle(rate: float, rss: int) -> Result:
        extra = {"connect_rate_per_s": rate, "broker_rss_per_connection_bytes": rss}
        return Result("idle", 0, "x:1", 0, 0, 0, 0, 0, 0.0, 1.0, extra=extra)

    summary = comparison([idle(100.0, 3000)], [idle(200.0, 1000)])
    assert summary["connect_rate_per_s_ratio_median"] == 0.5
    assert summary["broker_rss_per_connection_bytes_ratio_median"] == 3.0

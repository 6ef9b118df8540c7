"""The files of `weir bench --vs ... --report-dir`: the Markdown table and the PNG chart."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.compared import figures, markdown, write
from bench.report import Latency, Result


def _result(broker: str, rate: float, p99: float) -> Result:
    latency = Latency(p50_ms=p99 / 2, p99_ms=p99, p999_ms=p99 * 2, max_ms=p99 * 3, samples=10)
    return Result("latency", 1, broker, 10, 10, 10, 0, 0, rate, 1.0, latency=latency)


OURS = [_result("127.0.0.1:1883", r, p) for r, p in ((1000.0, 2.0), (3000.0, 4.0), (2000.0, 3.0))]
PEER = [_result("127.0.0.1:1884", r, p) for r, p in ((1000.0, 1.0), (1000.0, 1.0), (1000.0, 2.0))]
NOW = datetime(2026, 11, 26, 12, 0, 5, tzinfo=UTC)


def test_figures_are_medians_and_the_median_per_round_ratio() -> None:
    rows = {f.name: f for f in figures(OURS, PEER)}
    assert list(rows) == ["msg/s", "latency p50 ms", "latency p99 ms", "latency p99.9 ms"]
    assert (rows["msg/s"].ours, rows["msg/s"].peer, rows["msg/s"].ratio) == (2000.0, 1000.0, 2.0)
    # per round 2.0, 4.0, 1.5: the median ratio, not the ratio of the medians (3.0 / 1.0)
    assert rows["latency p99 ms"].ratio == 2.0


def test_figures_leave_out_what_a_round_lacks() -> None:
    idle_ours = [Result("idle", 0, "a:1", 0, 0, 0, 0, 0, 0.0, 1.0,
                        extra={"connect_rate_per_s": 500.0})]  # fmt: skip
    idle_peer = [Result("idle", 0, "b:1", 0, 0, 0, 0, 0, 0.0, 1.0,
                        extra={"connect_rate_per_s": 250.0})]  # fmt: skip
    rows = figures(idle_ours, idle_peer)
    assert [(f.name, f.ratio) for f in rows] == [("connects/s", 2.0)]


def test_markdown_table() -> None:
    table = markdown("latency, QoS 1: 3 rounds", "ours:1", "peer:2", figures(OURS, PEER)[:2])
    assert table == (
        "# latency, QoS 1: 3 rounds\n"
        "\n"
        "| figure | ours:1 | peer:2 | ours / peer |\n"
        "|---|---:|---:|---:|\n"
        "| msg/s | 2,000 | 1,000 | 2.000 |\n"
        "| latency p50 ms | 1.5 | 0.5 | 2.000 |\n"
        "\n"
        "Medians over the rounds; the ratio is the median of the per-round ratios.\n"
    )


def test_write_makes_the_table_and_a_png_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the chart needs the spark extra's matplotlib")
    from matplotlib.image import imread

    table, chart = write(tmp_path / "out", (OURS, PEER), NOW)
    assert table == tmp_path / "out" / "latency-qos1-20261126T120005Z.md"
    assert "| msg/s | 2,000 | 1,000 | 2.000 |" in table.read_text()
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = imread(chart).shape[:2]
    assert width > height > 0  # four panels side by side


def test_an_unwritable_folder_is_one_line(tmp_path: Path) -> None:
    from bench.errors import BenchError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(BenchError, match=r"^--report-dir: cannot write in .*file"):
        write(blocker, (OURS, PEER), NOW)

"""`weir bench --vs ... --report-dir DIR`: the compared figures as files.

A Markdown table (one row per figure: our median, the peer's median, the
median of the per-round ratios, as on the comparison line) and a PNG bar
chart (one panel per figure, since their units differ), named after the
scenario, the QoS and the UTC time of the run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.errors import BenchError
from bench.report import Result


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    ours: float  # median over the rounds
    peer: float
    ratio: float | None  # median of the per-round ratios ours / peer; None when peer is 0


Pick = Callable[[Result], float | None]

_FIGURES: tuple[tuple[str, Pick], ...] = (
    ("msg/s", lambda r: r.msg_per_s),
    ("connects/s", lambda r: r.extra.get("connect_rate_per_s")),
    ("RSS bytes per connection", lambda r: r.extra.get("broker_rss_per_connection_bytes")),
    ("latency p50 ms", lambda r: r.latency.p50_ms if r.latency else None),
    ("latency p99 ms", lambda r: r.latency.p99_ms if r.latency else None),
    ("latency p99.9 ms", lambda r: r.latency.p999_ms if r.latency else None),
)


def figures(ours: list[Result], peer: list[Result]) -> list[Figure]:
    """Every figure that all rounds of both brokers report (idle runs have
    no meaningful msg/s: a figure of 0 on both sides is left out too)."""
    out: list[Figure] = []
    for name, pick in _FIGURES:
        picked = [pick(r) for r in ours], [pick(r) for r in peer]
        if not ours or not peer or any(x is None for x in picked[0] + picked[1]):
            continue
        mine, theirs = ([float(x) for x in side if x is not None] for side in picked)
        if not any(mine + theirs):
            continue
        ratios = [x / y for x, y in zip(mine, theirs, strict=True) if y > 0]
        out.append(Figure(
            name, statistics.median(mine), statistics.median(theirs),
            round(statistics.median(ratios), 3) if ratios else None,
        ))  # fmt: skip
    return out


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def markdown(title: str, ours: str, peer: str, rows: list[Figure]) -> str:
    lines = [
        f"# {title}",
        "",
        f"| figure | {ours} | {peer} | ours / peer |",
        "|---|---:|---:|---:|",
    ]
    for f in rows:
        ratio = "-" if f.ratio is None else f"{f.ratio:.3f}"
        lines.append(f"| {f.name} | {_number(f.ours)} | {_number(f.peer)} | {ratio} |")
    lines += ["", "Medians over the rounds; the ratio is the median of the per-round ratios."]
    return "\n".join(lines) + "\n"


def write_png(path: Path, title: str, ours: str, peer: str, rows: list[Figure]) -> None:
    try:
        from matplotlib.figure import Figure as Canvas  # no pyplot: no GUI backend, no state
    except ImportError:
        raise BenchError("--report-dir needs matplotlib (the spark extra)") from None
    chart = Canvas(figsize=(3.0 * max(1, len(rows)), 3.2), layout="constrained")
    axes = chart.subplots(1, max(1, len(rows)), squeeze=False)[0]
    for ax, f in zip(axes, rows, strict=False):
        bars = ax.bar([ours, peer], [f.ours, f.peer], color=["tab:blue", "tab:gray"])
        ax.bar_label(bars, labels=[_number(f.ours), _number(f.peer)], fontsize=8)
        ax.set_title(f.name, fontsize=9)
        ax.tick_params(axis="x", labelsize=8, labelrotation=15)
        ax.margins(y=0.15)
    chart.suptitle(title, fontsize=10)
    chart.savefig(path, format="png", dpi=100)


def write(folder: Path, results: tuple[list[Result], list[Result]], now: datetime) -> list[Path]:
    """The Markdown table and the PNG chart of one `--vs` comparison; their paths."""
    ours, peer = results
    first = (ours or peer)[0]
    title = f"{first.scenario}, QoS {first.qos}: {len(ours)} round{'s' * (len(ours) != 1)}"
    names = (ours[0].broker if ours else "ours", peer[0].broker if peer else "peer")
    rows = figures(ours, peer)
    stem = f"{first.scenario}-qos{first.qos}-{now:%Y%m%dT%H%M%SZ}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        table = folder / f"{stem}.md"
        table.write_text(markdown(title, *names, rows))
        chart = folder / f"{stem}.png"
        write_png(chart, title, *names, rows)
    except OSError as exc:
        raise BenchError(f"--report-dir: cannot write in {folder}: {exc.strerror or exc}") from None
    return [table, chart]

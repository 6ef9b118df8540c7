"""What a run reports: one JSON line per run, and the comparison line of `--vs`."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    samples: int


@dataclass(frozen=True, slots=True)
class Result:
    scenario: str
    qos: int
    broker: str
    sent: int
    expected: int
    received: int
    loss: int
    duplicates: int
    msg_per_s: float
    duration_s: float
    latency: Latency | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        record = asdict(self)
        extra = record.pop("extra")
        return json.dumps({**record, **extra}, sort_keys=False)


IDLE_KEYS = ("connect_rate_per_s", "broker_rss_per_connection_bytes")


def percentile(sorted_values: Sequence[int], fraction: float) -> int:
    """Nearest-rank percentile of an ascending sequence."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def latency_of(samples_ns: list[int]) -> Latency | None:
    if not samples_ns:
        return None
    ordered = sorted(samples_ns)

    def ms(value: int) -> float:
        return round(value / 1e6, 4)

    return Latency(
        p50_ms=ms(percentile(ordered, 0.50)),
        p99_ms=ms(percentile(ordered, 0.99)),
        p999_ms=ms(percentile(ordered, 0.999)),
        max_ms=ms(ordered[-1]),
        samples=len(ordered),
    )


def _median_ratio(ours: list[float], theirs: list[float]) -> float | None:
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
    return round(statistics.median(ratios), 3) if ratios else None


def comparison(ours: list[Result], peer: list[Result]) -> dict[str, Any]:
    """The `--vs` summary: medians of per-round ratios, ours / peer."""
    line: dict[str, Any] = {
        "compare": ours[0].scenario if ours else None,
        "qos": ours[0].qos if ours else None,
        "ours": ours[0].broker if ours else None,
        "peer": peer[0].broker if peer else None,
        "rounds": len(ours),
        "throughput_ratio_median": _median_ratio(
            [r.msg_per_s for r in ours], [r.msg_per_s for r in peer]
        ),
    }
    for key in IDLE_KEYS:
        if ours and all(isinstance(r.extra.get(key), int | float) for r in ours + peer):
            line[f"{key}_ratio_median"] = _median_ratio(
                [r.extra[key] for r in ours], [r.extra[key] for r in peer]
            )
    if all(r.latency for r in ours + peer) and ours:
        for key in ("p50_ms", "p99_ms", "p999_ms"):
            line[f"latency_{key}_ratio_median"] = _median_ratio(
                [getattr(r.latency, key) for r in ours], [getattr(r.latency, key) for r in peer]
            )
    return line

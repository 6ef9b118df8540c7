"""GET /metrics while the idle scenario holds its connections: how long a scrape
takes with N clients connected (issue 18: under 50 ms with 50,000).

`timed_gets(urls, count)` GETs each URL `count` times in turn (one at a time,
as Prometheus scrapes a target) and gives per URL the p50, p99 and largest
time in ms and the body's size; a URL that fails is a BenchError naming it.
`weir bench idle --scrape URL [--scrape URL ...] [--scrapes N]` runs it
after every connection is open and before any is closed.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from bench.errors import BenchError

SCRAPE_TIMEOUT_S = 10.0  # a scrape this slow has failed the figure by 200 times anyway


def percentile(sorted_ms: Sequence[float], share: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    rank = max(0, min(len(sorted_ms) - 1, math.ceil(share * len(sorted_ms)) - 1))
    return sorted_ms[rank]


def timed_gets(urls: Sequence[str], count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for url in urls:
        times: list[float] = []
        size = 0
        for _ in range(count):
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                    size = len(response.read())
            except (urllib.error.URLError, OSError) as exc:
                raise BenchError(f"scrape of {url} failed: {exc}") from None
            times.append((time.perf_counter() - began) * 1000)
        times.sort()
        out[url] = {"scrapes": count, "p50_ms": round(percentile(times, 0.5), 2),
                    "p99_ms": round(percentile(times, 0.99), 2),
                    "max_ms": round(times[-1], 2), "bytes": size}  # fmt: skip
    return out

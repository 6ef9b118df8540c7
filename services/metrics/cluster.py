"""The cluster's figures: every live node's, summed, without a Prometheus server.

Theory of operation. Every `interval_s` (the node's `--sys-interval`; 10 s
when that is 0) `ClusterFigures` reads this node's figures (every family of
`Metrics`, labelled ones as a dict per label value), writes them with the
time into one Redis hash, `weir:figures` (field: the node id; value: JSON
`{"at": ms, "figures": {...}}`), reads the whole hash back and folds the
entries written within `STALE_INTERVALS` intervals into one `Aggregate`:
a node that stopped writing (dead, stopped, cut off) drops out of the sum
by itself, and its entry is removed by whoever reads it next. Two round
trips per interval per node, whatever the number of clients. Without Redis
(`--backend memory`) the store is this node's memory and the cluster is
this node.

Most figures are summed; the few that each node already knows for the
whole cluster (`retained`, `nodes_live`) or that do not add up
(`eventloop_lag_seconds`) take the largest node's (`MAXED`).

The management API reads `latest` (the last fold) or awaits `collect()`
(a fresh one). When the $SYS tree is on, each node also publishes the fold
to its own subscribers, retained on that node (`publish`: the broker's
local-only publish, so a subscriber anywhere gets one copy per interval,
from its own node):

    $SYS/brokers                      the live node ids, comma-separated (EMQX's)
    $SYS/cluster/nodes/live           how many nodes wrote figures lately
    $SYS/cluster/<topic>              each topic of the per-node tree
                                      (clients/connected, messages/received, ...;
                                      services.metrics.systopics.counts), summed
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from services.metrics.registry import Metrics, Refresh, samples
from services.metrics.systopics import SYS_INTERVAL_S, Publish, counts
from services.store.redis import bounded

log = logging.getLogger("weir.metrics")

FIGURES_KEY: Final = "weir:figures"  # hash: node id -> {"at": ms, "figures": {...}}
STALE_INTERVALS: Final = 3  # an entry this many intervals old is a node that stopped writing
REDIS_TIMEOUT_S: Final = 2.0  # per call (services.store.redis.DEFAULT_TIMEOUT_S)
MAXED: Final = frozenset({"retained", "nodes_live", "eventloop_lag_seconds"})

Figures = dict[str, Any]  # family field -> a number, or {label value (str): number}


class FigureStore(Protocol):
    async def put(self, node: str, entry: bytes) -> None:
        """Write this node's entry (JSON), replacing its last one."""
        ...

    async def entries(self) -> dict[str, bytes]:
        """Every node's last entry."""
        ...

    async def forget(self, nodes: list[str]) -> None:
        """Remove the entries of nodes that stopped writing."""
        ...


class MemoryFigures:
    """One process's store: the cluster is this node (`--backend memory`, tests)."""

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}

    async def put(self, node: str, entry: bytes) -> None:
        self._entries[node] = entry

    async def entries(self) -> dict[str, bytes]:
        return dict(self._entries)

    async def forget(self, nodes: list[str]) -> None:
        for node in nodes:
            self._entries.pop(node, None)


class RedisFigures:
    """The hash `weir:figures` in the cluster's Redis."""

    def __init__(self, client: Any, timeout_s: float = REDIS_TIMEOUT_S) -> None:
        self._client = client
        self._timeout_s = timeout_s

    async def put(self, node: str, entry: bytes) -> None:
        await bounded(self._client.hset(FIGURES_KEY, node, entry), self._timeout_s)

    async def entries(self) -> dict[str, bytes]:
        raw = await bounded(self._client.hgetall(FIGURES_KEY), self._timeout_s)
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}

    async def forget(self, nodes: list[str]) -> None:
        if nodes:
            await bounded(self._client.hdel(FIGURES_KEY, *nodes), self._timeout_s)


@dataclass(frozen=True, slots=True)
class Aggregate:
    """The cluster's figures at `at_ms`: summed over `nodes` (see MAXED)."""

    at_ms: int
    nodes: tuple[str, ...]  # the nodes whose figures are in it, sorted
    figures: Figures = field(default_factory=dict)
    per_node: dict[str, Figures] = field(default_factory=dict)


def figures_of(m: Metrics) -> Figures:
    """A node's figures as JSON-ready values (label values as strings)."""
    out: Figures = {}
    for family, value in samples(m):
        out[family.field] = (
            {str(k): v for k, v in value.items()} if isinstance(value, dict) else value
        )
    return out


def fold(entries: dict[str, Figures]) -> Figures:
    """The cluster's figures from each node's: summed, or the largest (MAXED)."""
    total: Figures = {}
    for figures in entries.values():
        for name, value in figures.items():
            pick = max if name in MAXED else _add
            if isinstance(value, dict):
                mine = total.setdefault(name, {})
                for label, number in value.items():
                    mine[label] = pick(mine.get(label, 0), number)
            else:
                total[name] = pick(total.get(name, 0), value)
    return total


def _add(a: float, b: float) -> float:
    return a + b


def sys_figures(aggregate: Aggregate) -> dict[str, str]:
    """The $SYS topics of a fold and their payloads (see the module docstring)."""
    m = Metrics()
    for name, value in aggregate.figures.items():
        current = getattr(m, name, None)
        if isinstance(current, dict) and isinstance(value, dict):
            for key in current:
                current[key] = value.get(str(key), 0)
        elif current is not None and not isinstance(value, dict):
            setattr(m, name, value)
    out = {"$SYS/brokers": ",".join(aggregate.nodes),
           "$SYS/cluster/nodes/live": str(len(aggregate.nodes))}  # fmt: skip
    out.update((f"$SYS/cluster/{topic}", str(value)) for topic, value in counts(m).items())
    return out


class ClusterFigures:
    """Writes this node's figures, folds every live node's (module docstring)."""

    def __init__(
        self,
        node: str,
        metrics: Metrics,
        store: FigureStore,
        publish: Publish | None,  # the broker's local publish; None: no $SYS tree
        interval_s: float = SYS_INTERVAL_S,
        refresh: Refresh | None = None,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.node = node
        self.metrics = metrics
        self.store = store
        self.publish = publish
        self.interval_s = interval_s if interval_s > 0 else SYS_INTERVAL_S
        self.refresh = refresh
        self.wall_ms = wall_ms
        self.latest: Aggregate | None = None  # the last fold (None: none yet)
        self._sent: dict[str, bytes] = {}
        self._task: asyncio.Task[None] | None = None

    async def collect(self) -> Aggregate:
        """Write this node's figures now, read every node's, fold the live ones.
        Raises services.session.api.StoreUnavailable when Redis does not answer."""
        if self.refresh is not None:
            self.refresh(self.metrics)
        now = self.wall_ms()
        mine = figures_of(self.metrics)
        await self.store.put(self.node, json.dumps({"at": now, "figures": mine}).encode())
        live: dict[str, Figures] = {}
        stale: list[str] = []
        oldest = now - STALE_INTERVALS * self.interval_s * 1000
        for node, raw in (await self.store.entries()).items():
            try:
                entry = json.loads(raw)
                at, figures = int(entry["at"]), entry["figures"]
            except (ValueError, KeyError, TypeError):
                stale.append(node)  # not ours to read: gone with the next forget
                continue
            if at < oldest:
                stale.append(node)
            else:
                live[node] = figures
        live[self.node] = mine
        if stale:
            await self.store.forget(stale)
        self.latest = Aggregate(now, tuple(sorted(live)), fold(live), live)
        return self.latest

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                self._publish(await self.collect())
            except Exception as exc:  # Redis away: the next interval tries again
                log.warning("cluster figures not collected: %s", exc)
            await asyncio.sleep(self.interval_s)

    def _publish(self, aggregate: Aggregate) -> None:
        if self.publish is None:
            return
        for topic, text in sys_figures(aggregate).items():
            payload = text.encode()
            if self._sent.get(topic) != payload:
                self.publish(topic, payload, True)
                self._sent[topic] = payload

"""What one node runs to be watched: the HTTP port with /metrics, the $SYS
tree, the alarms and the event-loop lag probe, over one `Metrics`.

The node builds it once its broker exists (the broker makes the messages
`publish` sends and knows the figures `refresh` fills), starts it before it
reports ready and stops it in its ordered shutdown, after the listeners
(the last figures of a stopping node are not worth a scrape).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence

from aiohttp import web

from services.metrics.alarms import DEFAULT_THRESHOLDS, Alarms, Thresholds, Watch
from services.metrics.collector import Exposition, NodeCollector
from services.metrics.http import HttpServer, metrics_routes
from services.metrics.memory import MemoryReturn, glibc_trim
from services.metrics.process import LagMonitor
from services.metrics.registry import Metrics, Refresh
from services.metrics.systopics import Publish, SysTopics
from services.store.redis import UNANSWERED


class MetricsService:
    def __init__(
        self,
        metrics: Metrics,
        node: str,
        version: str,
        publish: Publish,
        *,
        http_host: str,
        http_port: int | None,  # None: no HTTP port (`--http-port off`)
        sys_interval_s: float,  # 0: no $SYS tree
        max_connections: int,
        refresh: Refresh | None = None,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        # More of the HTTP port (the management API), made from this service once
        # its parts (the alarms) exist.
        routes: Callable[[MetricsService], Sequence[web.RouteDef]] | None = None,
        http_ssl: ssl.SSLContext | None = None,  # TLS on the HTTP port
    ) -> None:
        self.metrics = metrics

        def figures(m: Metrics) -> None:
            m.fold()
            m.redis_failures = UNANSWERED.count
            if refresh is not None:
                refresh(m)

        self.figures = figures
        self.collector = NodeCollector(metrics, node, version, figures)
        self.sys = SysTopics(metrics, node, version, publish, sys_interval_s, figures)
        self.alarms = Alarms(metrics, node, publish)
        self.watch = Watch(metrics, self.alarms, max_connections, thresholds, refresh=figures)
        self.lag = LagMonitor(metrics)
        self.memory = MemoryReturn(metrics, glibc_trim())
        self.http = None
        if http_port is not None:
            more = routes(self) if routes is not None else ()
            self.http = HttpServer(
                http_host, http_port, [*metrics_routes(Exposition(self.collector)), *more],
                http_ssl,
            )

    @property
    def http_port(self) -> int | None:
        return None if self.http is None else self.http.port

    async def start(self) -> None:
        """Start everything; OSError (the HTTP port in use) leaves nothing running."""
        loop = asyncio.get_running_loop()
        if self.http is not None:
            await self.http.start()
        self.lag.start(loop)
        self.memory.start(loop)
        self.sys.start(loop)
        self.watch.start(loop)

    async def stop(self) -> None:
        self.watch.stop()
        self.sys.stop()
        self.lag.stop()
        self.memory.stop()
        if self.http is not None:
            await self.http.stop()

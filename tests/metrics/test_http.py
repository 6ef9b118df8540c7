"""The node's HTTP port and the service around it, on a real loopback socket."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.metrics.collector import Exposition, NodeCollector
from services.metrics.http import HttpServer, metrics_routes
from services.metrics.process import LagMonitor
from services.metrics.registry import Metrics
from services.metrics.service import MetricsService
from services.store.redis import UNANSWERED


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, response.headers["Content-Type"], await response.text()


def server(m: Metrics, port: int = 0) -> HttpServer:
    return HttpServer("127.0.0.1", port, metrics_routes(Exposition(NodeCollector(m, "n1", "v"))))


async def test_metrics_are_served_in_the_prometheus_text_format() -> None:
    m = Metrics()
    http = server(m)
    port = await http.start()
    try:
        assert port > 0 and http.url("/metrics") == f"http://127.0.0.1:{port}/metrics"
        m.messages_sent[2] += 5
        status, content_type, text = await get(http.url("/metrics"))
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        [qos2] = [s for s in families["weir_messages_sent"].samples if s.labels == {"qos": "2"}]
        assert qos2.value == 5
        assert families["process_resident_memory_bytes"].samples[0].value > 0
        status, _, _ = await get(http.url("/nothing"))
        assert status == 404
    finally:
        await http.stop()
    with socket.socket() as probe:  # the port is free again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


async def test_a_port_in_use_is_an_oserror_with_nothing_left_open() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http = server(Metrics(), taken.getsockname()[1])
        with pytest.raises(OSError):
            await http.start()
        await http.stop()  # nothing to stop: no error


async def test_the_lag_monitor_sees_a_stalled_loop() -> None:
    m = Metrics()
    lag = LagMonitor(m, probe_s=0.02)
    lag.start(asyncio.get_running_loop())
    try:
        time.sleep(0.3)  # the stall being measured: the loop runs nothing meanwhile
        async with asyncio.timeout(5):
            while m.eventloop_lag_seconds < 0.25:
                await asyncio.sleep(0.01)
        assert m.eventloop_lag_seconds < 5
    finally:
        lag.stop()


async def test_the_service_starts_and_stops_its_parts() -> None:
    m = Metrics()
    published: list[str] = []
    service = MetricsService(
        m, "n1", "v", lambda topic, payload, retain: published.append(topic),
        http_host="127.0.0.1", http_port=0, sys_interval_s=10, max_connections=100,
    )  # fmt: skip
    await service.start()
    try:
        assert service.http_port
        status, _, text = await get(f"http://127.0.0.1:{service.http_port}/metrics")
        assert status == 200 and "weir_node_info" in text
        # The process's unanswered Redis calls come in with every read.
        assert f"weir_redis_failures_total {float(UNANSWERED.count)}" in text
        assert "$SYS/brokers/n1/version" in published  # at start, not an interval later
        assert service.memory._handle is not None  # memory given back after departures
    finally:
        await service.stop()
    assert service.sys._handle is None and service.watch._handle is None
    assert service.memory._handle is None


async def test_without_an_http_port_nothing_listens() -> None:
    service = MetricsService(
        Metrics(), "n1", "v", lambda *a: None,
        http_host="127.0.0.1", http_port=None, sys_interval_s=0, max_connections=100,
    )  # fmt: skip
    await service.start()
    assert service.http_port is None
    await service.stop()

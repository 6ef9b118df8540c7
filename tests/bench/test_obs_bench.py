"""The observability benchmarks' parts (issue 18), without running them at
scale: the recorder-off build, the no-op plugin, the scrape timings."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from bench.recorder_off import build, strip
from bench.scrape import percentile, timed_gets
from services.hooks.api import Hooks
from services.hooks.plugins import Plugins
from services.metrics.http import HttpServer


def test_strip_removes_counting_and_keeps_the_rest() -> None:
    source = (
        "def f(self, n, metrics):\n"
        "    self.metrics.connections += 1\n"
        "    self.seams.metrics.messages_dropped['acl'] += n\n"
        "    metrics.messages_sent[0] += n\n"
        "    self.seams.metrics.connected()\n"
        "    tally[6] += n\n"
        "    self.tally[9] += n\n"
        "    self.count += 1\n"
        "    return n\n"
        "class MetricsService:\n"
        "    async def start(self):\n"
        "        await self.http.start()\n"
    )
    out, removed = strip(source)
    assert removed == 7
    tree = ast.parse(out)
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    kept = "".join(ast.unparse(stmt) for stmt in body.body)
    assert "metrics" not in kept and "tally" not in kept
    assert "self.count += 1" in out and "return n" in out and "http" not in out


def test_the_build_removes_every_figure_increment_and_still_compiles(tmp_path: Path) -> None:
    removed = build(tmp_path)
    assert removed >= 40  # every hot-path count of services/ (a moved one shows here)
    for path in (tmp_path / "services").rglob("*.py"):
        text = path.read_text()
        compile(text, str(path), "exec")
        if path.name not in ("registry.py", "trace.py"):
            tree = ast.parse(text)
            bumps = [n for n in ast.walk(tree) if isinstance(n, ast.AugAssign)
                     and "metrics." in ast.unparse(n.target)]  # fmt: skip
            assert bumps == [], path
    assert (tmp_path / "services/queue/scripts/enqueue_take.lua").exists()


def test_the_noop_plugin_adds_its_callbacks_to_both_points() -> None:
    hooks = Hooks()
    Plugins(hooks).load_named([("bench.noop_plugin:NoopCallbacks", {"count": 5})])
    assert len(hooks.callbacks("message.publish")) == 5
    assert len(set(hooks.callbacks("message.delivered"))) == 5
    assert hooks.fold("message.publish", "m", None) == "m" and hooks.watches_copies


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (50.0, 99.0)
    assert percentile([7.0], 0.99) == 7.0


async def test_timed_gets_reads_a_metrics_port() -> None:
    from aiohttp import web

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="weir_connections 0\n")

    server = HttpServer("127.0.0.1", 0, [web.get("/metrics", metrics)])
    await server.start()
    try:
        got = await asyncio.to_thread(timed_gets, [server.url("/metrics")], 3)
    finally:
        await server.stop()
    figures = got[server.url("/metrics")]
    assert figures["scrapes"] == 3 and figures["bytes"] == len("weir_connections 0\n")
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    with pytest.raises(Exception, match="scrape of"):
        timed_gets([server.url("/metrics")], 1)  # stopped: refused

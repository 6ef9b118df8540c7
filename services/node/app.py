"""Composition root and `weir up`.

`build_services(settings)` is the one place that picks implementations
(memory today; Redis and Kafka slot in here when `--redis` / `--kafka` are
given). `main(argv)` parses the command line, loads settings, runs one node
until SIGINT/SIGTERM, and maps failures to exit codes: 2 for bad
configuration, 1 when the node cannot start (e.g. a port in use), 0 after a
clean shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from services.settings import Settings, SettingsError, load

if TYPE_CHECKING:
    from services.node.node import Services

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SettingsError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="weir up", description="Run a Weir MQTT broker node.")
    p.add_argument("--config", help="TOML config file (default: $WEIR_CONFIG)")
    p.add_argument("--node-id", dest="node_id", help="this node's id")
    p.add_argument(
        "--host",
        dest="listeners.host",
        help="address to listen on (default 0.0.0.0, every interface, like Mosquitto)",
    )
    p.add_argument("--mqtt-port", dest="listeners.mqtt_port", help="MQTT TCP port (1883)")
    p.add_argument("--ws-port", dest="listeners.ws_port", help="MQTT over WebSocket port (8083)")
    p.add_argument("--data-dir", dest="data_dir", help="directory for node data")
    return p


def parse_args(argv: Sequence[str]) -> dict[str, Any]:
    return dict(vars(parser().parse_args(list(argv))))


def build_services(settings: Settings) -> Services:
    from services.node.node import Services
    from services.queue.memory import MemoryQueueStore
    from services.retain.store import MemoryRetainStore
    from services.session.memory import MemorySessionStore

    sessions = MemorySessionStore()
    queue = MemoryQueueStore(sessions, limit=settings.limits.queue_limit)
    return Services(sessions=sessions, queue=queue, retain=MemoryRetainStore())


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> int:
    from services.node.node import Node

    node = Node(settings, build_services(settings))
    try:
        await node.start()
    except OSError as exc:
        listeners = settings.listeners
        print(
            f"weir: cannot listen on {listeners.host} (mqtt {listeners.mqtt_port}, "
            f"ws {listeners.ws_port}): {exc.strerror or exc}",
            file=sys.stderr,
        )
        return EXIT_START_FAILED
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ws = f", ws on {settings.listeners.host}:{node.ws_port}" if node.ws_port else ""
    print(
        f"weir: node {settings.node_id} ready, mqtt on "
        f"{settings.listeners.host}:{node.mqtt_port}{ws} (memory backends)",
        flush=True,
    )
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await node.stop()
    return EXIT_OK


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def main(argv: Sequence[str]) -> int:
    try:
        settings = load(parse_args(argv))
    except SettingsError as exc:
        print(f"weir up: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(serve(settings))

"""`weir up --workers N`: N node processes on one machine sharing one MQTT port.

Theory of operation. One process holds at most about 19,900 connections
(20,000 open files, a hard limit here) and uses one core (DESIGN 11). The
supervisor starts the shared backends once (an embedded redis-server and
Kafka, unless --redis / --kafka name existing ones), then N `weir up`
worker processes. Each worker is a full cluster node with its own id
(`<node-id>-<i>`): it claims sessions in Redis, logs to Kafka, joins the
membership and forwards to the others over cluster links. All of them
listen on the same MQTT (and WebSocket) port with SO_REUSEPORT, so the
kernel spreads new connections over them and clients see one broker.

Workers rather than `--nodes N` (separate ports): one address for clients,
as with one node; nodes on their own ports are what several `weir up`
commands (or docker compose) already give.

Stop: SIGINT / SIGTERM to the supervisor go to every worker; it waits for
them (bounded), then stops the backends it started. A worker that exits on
its own stops the group with exit 1: half a group would serve some
clients and refuse the rest.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from services.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2
MAX_WORKERS = 64
STOP_TIMEOUT_S = 30.0  # per worker: its shutdown grace plus flushing the log
POLL_S = 0.2  # how often the supervisor looks for a worker that died


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def worker_args(
    argv: Sequence[str], settings: Settings, index: int, redis_url: str, kafka: str,
    mqtt_port: int, ws_port: int | None,
) -> list[str]:  # fmt: skip
    args = [
        sys.executable, "-m", "services", "up", *argv,
        "--node-id", f"{settings.node_id}-{index}",
        "--redis", redis_url, "--kafka", kafka,
        "--mqtt-port", str(mqtt_port),
        "--data-dir", str(Path(settings.data_dir) / f"worker-{index}"),
        "--reuse-port",
    ]  # fmt: skip
    if ws_port is not None:
        args += ["--ws-port", str(ws_port)]
    return args


def supervise(settings: Settings, argv: Sequence[str], workers: int, spark: bool = False) -> int:
    if not 1 <= workers <= MAX_WORKERS:
        print(f"weir up: --workers must be 1..{MAX_WORKERS}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if settings.backend == "memory":
        print(
            "weir up: --workers needs shared backends (Redis and Kafka); "
            "--backend memory is one process",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    started: list[Any] = []
    procs: list[subprocess.Popen[bytes]] = []
    job: subprocess.Popen[bytes] | None = None
    try:
        redis_url, kafka = _backends(settings, started)
        host = settings.listeners.host
        mqtt_port = settings.listeners.mqtt_port or free_port(host)
        ws_port = settings.listeners.ws_port
        if ws_port == 0:
            ws_port = free_port(host)
        for i in range(1, workers + 1):
            args = worker_args(argv, settings, i, redis_url, kafka, mqtt_port, ws_port)
            procs.append(subprocess.Popen(args))
        print(
            f"weir: {workers} workers sharing mqtt {host}:{mqtt_port} "
            f"(redis {redis_url}, kafka {kafka})",
            flush=True,
        )
        if spark:  # one job for the group; it waits out a re-seed by a worker (streams)
            from services.node import sparkjob

            job = sparkjob.start(settings, redis_url, kafka)
            print(f"weir: state-store Spark job started (pid {job.pid})", flush=True)
        return _wait(procs)
    except _StartFailed as exc:
        print(f"weir: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        _stop_all(procs)
        if job is not None:
            from services.node import sparkjob

            print(f"weir: state-store Spark job stopped (exit {sparkjob.stop(job)})", flush=True)
        for service in reversed(started):
            with contextlib.suppress(Exception):
                service.stop()


class _StartFailed(Exception):
    pass


def _backends(settings: Settings, started: list[Any]) -> tuple[str, str]:
    from services.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError
    from services.embedded.redis_server import RedisServer, RedisServerError

    redis_url = settings.redis_url
    if redis_url is None:
        data = Path(settings.data_dir).resolve() / "redis"
        try:
            server = RedisServer(data, profile=settings.durability).start()
        except (RedisServerError, OSError) as exc:
            raise _StartFailed(f"cannot start redis-server: {exc}") from None
        started.append(server)
        redis_url = server.url
    kafka = settings.kafka_bootstrap
    if kafka is None:
        try:
            broker = EmbeddedKafka().start()
        except (EmbeddedKafkaError, OSError) as exc:
            raise _StartFailed(f"cannot start the embedded Kafka: {exc}") from None
        started.append(broker)
        kafka = broker.bootstrap
    return redis_url, kafka


def _wait(procs: list[subprocess.Popen[bytes]]) -> int:
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopping:
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                print(f"weir: worker pid {dead[0].pid} exited; stopping", file=sys.stderr)
                return EXIT_FAILED
            time.sleep(POLL_S)
        return EXIT_OK
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

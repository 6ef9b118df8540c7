"""`weir up --nodes N` / `--workers N`: a supervisor for N node processes on one machine.

Theory of operation. One process holds at most about 19,900 connections
(20,000 open files, a hard limit here) and uses one core (DESIGN 11). The
supervisor starts the shared backends once (an embedded redis-server and
Kafka, unless --redis / --kafka name existing ones), then N `weir up`
processes, and with --spark the one state-store job. Each process is a
full cluster node with its own id (`<node-id>-<i>`, i from 1): it claims
sessions in Redis, logs to Kafka, joins the membership and forwards to the
others over cluster links.

- `--nodes N`: node i listens on MQTT port + i - 1 (and WebSocket port +
  i - 1 when one is set, and so on for every other listener: TLS, WSS,
  the config file's [[listener]] tables, moved by `listeners.ports`);
  a port of 0 gives each node a free port, kept across its
  restarts.
- `--workers N`: every node listens on the same MQTT (and WebSocket) port
  with SO_REUSEPORT, so the kernel spreads new connections over them and
  clients see one broker.

Files (`services.machine.pidfiles`): `<data-dir>/nodes/<id>.pid`, `<id>.log`
(the node's stdout and stderr, appended across restarts) and `<id>/` (its
data dir). A node is ready when its log shows its ready line since its
last start; the supervisor then prints its own ready line for it.

Restarts. A node that exits 0 was asked to (a drain, `weir drain`, or a
SIGTERM of its own): it is not restarted. Any other exit after it has
been ready once is a death: it is restarted with the same id, ports and
settings file after RESTART_FIRST_S, doubling with each restart in the last
RESTART_WINDOW_S up to RESTART_MAX_S; at RESTARTS_PER_WINDOW restarts in
that window it is given up on (said on stderr), and the others keep
serving throughout. Exit 2 (bad configuration) is given up on at once. A
node that exits before its first ready line fails the start: everything
stops with exit 1, as one `weir up` whose port is taken does. When no node
is left running or waiting to restart, the supervisor stops: exit 0 if
every node exited 0, else 1.

Stop: SIGINT / SIGTERM stop all in order: the nodes (SIGTERM, they
disconnect their clients and flush; bounded, then killed), then the Spark
job, then Kafka, then Redis. Every child is tied to the supervisor with
PR_SET_PDEATHSIG (`services.embedded.process`): if the supervisor is
killed, even by SIGKILL, nothing outlives it: the nodes get SIGKILL with
the embedded backends (which they could not flush to any more), or
SIGTERM when both backends are external ones (they flush and exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from services.config import ENV_VARS, Settings
from services.config.listeners import ListenerConfig
from services.config.loader import write_snapshot
from services.embedded import endpoints
from services.embedded.process import child_options
from services.machine.backends import BackendError, start_backends
from services.machine.pidfiles import NodeFiles, nodes_dir
from services.ports import free_port

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2
MAX_PROCESSES = 64
MAX_PORT = 65535
STOP_TIMEOUT_S = 30.0  # per node: its shutdown grace plus flushing the log
POLL_S = 0.2  # how often the supervisor looks at its nodes
RESTART_FIRST_S = 1.0  # first restart delay: a crash loop costs at most one start a second
RESTART_MAX_S = 16.0
RESTART_WINDOW_S = 60.0
RESTARTS_PER_WINDOW = 5  # then the node is given up on: it fails at every start
READY_MARK = b" ready, mqtt on "  # the node's ready line (services.node.app)
NOT_CUT = (
    "weir: with --nodes/--workers the embedded log is not cut (every node appends to it and "
    "tails it): it grows by about 1.2 KiB of the embedded Kafka's memory per event until "
    "weir up starts again"
)


def plan_error(settings: Settings, nodes: int | None, workers: int | None) -> str | None:
    """Why these options cannot run, in one line, or None."""
    if nodes is not None and workers is not None:
        return "--nodes and --workers exclude each other (separate ports, or one shared port)"
    count, flag = (nodes, "--nodes") if nodes is not None else (workers, "--workers")
    assert count is not None
    if not 1 <= count <= MAX_PROCESSES:
        return f"{flag} must be 1..{MAX_PROCESSES}, not {count}"
    if settings.backend == "memory":
        return f"{flag} needs shared backends (Redis and Kafka); --backend memory is one process"
    http = settings.http_port
    if http and http + count - 1 > MAX_PORT:  # workers too: each has its own /metrics
        return (
            f"{flag} {count} from --http-port {http} needs ports up to {http + count - 1}; "
            f"the last is {MAX_PORT}"
        )
    if nodes is not None:
        listeners = settings.listeners
        others = [(f"listener {c.name}'s port", c.port) for c in _other_listeners(settings)]
        pairs = [("--mqtt-port", listeners.mqtt_port), ("--ws-port", listeners.ws_port)]
        for name, port in pairs + others:
            if port and port + count - 1 > MAX_PORT:
                return (
                    f"--nodes {count} from {name} {port} needs ports up to "
                    f"{port + count - 1}; the last is {MAX_PORT}"
                )
    return None


@dataclass
class Slot:
    """One node the supervisor keeps running, across its restarts."""

    node_id: str
    args: list[str]
    mqtt_port: int
    files: NodeFiles
    proc: subprocess.Popen[bytes] | None = None
    ready: bool = False  # this start printed its ready line
    served: bool = False  # some start did
    log_from: int = 0  # where this start's output begins in the log
    restarts: deque[float] = field(default_factory=deque)  # monotonic times
    restart_at: float | None = None
    ended: str = ""  # "exited" (0) or "given up"
    death_signal: int = signal.SIGKILL  # what it gets if the supervisor dies

    def start(self) -> None:
        self.files.root.mkdir(parents=True, exist_ok=True)
        self.log_from = self.files.log.stat().st_size if self.files.log.exists() else 0
        with self.files.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                **child_options(self.death_signal),
            )
        self.files.write_pid(self.proc.pid)
        self.ready, self.restart_at = False, None

    def saw_ready(self) -> bool:
        with self.files.log.open("rb") as log:
            log.seek(self.log_from)
            return READY_MARK in log.read()

    def last_log_line(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.files.log.read_bytes()[self.log_from :].decode(errors="replace")
            return (lines.strip().splitlines() or [""])[-1]
        return ""


def node_args(
    settings: Settings, files: NodeFiles, redis_url: str, kafka: str,
    mqtt_port: int, ws_port: int | None, reuse_port: bool, others: Sequence[str] = (),
    embedded_log: bool = False,
) -> list[str]:  # fmt: skip
    """A node's command line: `weir up --config <its settings file> --node-id ID`. The file
    is our effective settings with the node's own id, ports, data dir and the
    shared backends (`services.config.loader.write_snapshot`), read back by
    the same loader; the node gets no WEIR_* variables (`child_env`), so the
    file is all it reads. Nothing of our argv is passed on (not --nodes,
    --workers or --spark: the supervisor runs the one state-store job)."""
    moved = tuple((name, int(port)) for name, _, port in (o.partition("=") for o in others))
    mine = replace(
        settings,
        node_id=files.node_id,
        data_dir=str(files.data),
        redis_url=redis_url,
        kafka_bootstrap=kafka,
        listeners=replace(settings.listeners, mqtt_port=mqtt_port, ws_port=ws_port,
                          ports=moved),
    )
    snapshot = files.data / "settings.json"
    write_snapshot(mine, snapshot)
    # --node-id again, though the file has it: `weir drain` knows a node's
    # process by it in /proc/<pid>/cmdline (services.machine.pidfiles).
    args = [sys.executable, "-m", "services", "up", "--config", str(snapshot),
            "--node-id", files.node_id]  # fmt: skip
    if reuse_port:
        args.append("--reuse-port")
    if embedded_log:  # the log is in memory: the nodes keep the state store current
        args.append("--embedded-log")
    return args


def node_http_port(base: int | None, i: int) -> int | None:
    """Node (or worker) i's HTTP port: consecutive from `base`, as --nodes gives
    MQTT ports, since each process serves its own /metrics; 0 stays 0 (a free
    one each) and off stays off."""
    return base + i - 1 if base else base


def child_env() -> dict[str, str]:
    """Our environment without the settings' WEIR_* variables (they would
    override the node's settings file); others (WEIR_SPARK_MASTER...) stay."""
    return {k: v for k, v in os.environ.items() if k not in ENV_VARS}


def _other_listeners(settings: Settings) -> list[ListenerConfig]:
    return [c for c in settings.listeners.all() if c.name not in ("mqtt", "ws")]


def _other_ports(settings: Settings, count: int, shared: bool) -> list[list[str]]:
    """NAME=PORT per node for the listeners beyond mqtt and ws, as `_ports` does."""
    out: list[list[str]] = [[] for _ in range(count)]
    for config in _other_listeners(settings):
        one = config.port or free_port(config.host)
        for i, moved in enumerate(out):
            mine = config.port + i if config.port else free_port(config.host)
            moved.append(f"{config.name}={one if shared else mine}")
    return out


def _ports(settings: Settings, count: int, shared: bool) -> list[tuple[int, int | None]]:
    """(mqtt, ws) per node: one port for all (workers) or consecutive ones (nodes)."""
    host, listeners = settings.listeners.host, settings.listeners
    if shared:
        mqtt = listeners.mqtt_port or free_port(host)
        ws = listeners.ws_port if listeners.ws_port != 0 else free_port(host)
        return [(mqtt, ws)] * count
    out: list[tuple[int, int | None]] = []
    for i in range(count):
        mqtt = listeners.mqtt_port + i if listeners.mqtt_port else free_port(host)
        ws = listeners.ws_port
        if ws is not None:
            ws = ws + i if ws else free_port(host)
        out.append((mqtt, ws))
    return out


class _Stop:
    """SIGINT / SIGTERM, noted for the supervisor's loop; SIGHUP too, which
    the loop passes on to every node (they read their ACL file again)."""

    def __init__(self) -> None:
        self.requested = False
        self.reload = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.reload = True
        else:
            self.requested = True

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def supervise(
    settings: Settings,
    nodes: int | None = None,
    workers: int | None = None,
    spark: bool = False,
) -> int:
    error = plan_error(settings, nodes, workers)
    if error is not None:
        print(f"weir up: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    count = nodes if nodes is not None else workers
    assert count is not None
    started: list[Any] = []
    slots: list[Slot] = []
    job: subprocess.Popen[bytes] | None = None
    with _Stop() as stop:
        try:
            redis_url, kafka = start_backends(settings, started)
            root = nodes_dir(settings.data_dir)
            shared = workers is not None
            ports = _ports(settings, count, shared)
            others = _other_ports(settings, count, shared)
            for i, (mqtt_port, ws_port) in enumerate(ports, start=1):
                files = NodeFiles(f"{settings.node_id}-{i}", root)
                args = node_args(
                    replace(settings, http_port=node_http_port(settings.http_port, i)),
                    files, redis_url, kafka, mqtt_port, ws_port, shared, others[i - 1],
                    embedded_log=settings.kafka_bootstrap is None,
                )  # fmt: skip
                slot = Slot(files.node_id, args, mqtt_port, files)
                if not started:  # real backends outlive us: the nodes may flush to them
                    slot.death_signal = signal.SIGTERM
                slots.append(slot)
            _say_plan(settings, slots, shared, redis_url, kafka, root, others)
            if settings.kafka_bootstrap is None:  # services.node.logcut says why
                print(NOT_CUT, flush=True)
            endpoints.announce(
                settings.data_dir, redis_url, kafka, settings.kafka_topic_prefix,
                settings.node_id, f"{settings.listeners.host}:{slots[0].mqtt_port}",
            )  # fmt: skip
            for slot in slots:
                if not stop.requested:
                    slot.start()
            if spark and not stop.requested:  # one job for all; it waits out a re-seed (streams)
                from services.machine import sparkjob

                job = sparkjob.start(settings, redis_url, kafka)
                print(f"weir: state-store Spark job started (pid {job.pid})", flush=True)
            return _watch(slots, stop, settings.listeners.host)
        except (BackendError, _StartFailed) as exc:
            print(f"weir: {exc}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            endpoints.remove(settings.data_dir)
            _stop_all(slots)
            if job is not None:
                from services.machine import sparkjob

                code = sparkjob.stop(job)
                print(f"weir: state-store Spark job stopped (exit {code})", flush=True)
            for service in reversed(started):  # Kafka, then Redis
                with contextlib.suppress(Exception):
                    service.stop()


def _say_plan(
    settings: Settings, slots: list[Slot], shared: bool, redis_url: str, kafka: str, root: Path,
    others: Sequence[Sequence[str]] = (),
) -> None:  # fmt: skip
    host, ports = settings.listeners.host, [s.mqtt_port for s in slots]
    where = (
        f"{len(slots)} workers sharing mqtt {host}:{ports[0]}"
        if shared
        else f"{len(slots)} nodes on mqtt {host}:" + ",".join(map(str, ports))
    )
    named: dict[str, dict[str, None]] = {}  # listener -> its ports, in node order
    for moved in others:
        for item in moved:
            name, _, port = item.partition("=")
            named.setdefault(name, {})[port] = None
    where += "".join(f", {name} " + ",".join(found) for name, found in named.items())
    print(
        f"weir: {where} (redis {redis_url}, kafka {kafka}); pid and log files in {root}",
        flush=True,
    )


class _StartFailed(Exception):
    pass


def _watch(slots: list[Slot], stop: _Stop, host: str) -> int:
    """Keep the nodes running until a stop is asked for or none is left."""
    while not stop.requested:
        now = time.monotonic()
        reload, stop.reload = stop.reload, False
        for slot in slots:
            if reload and slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGHUP)
            if slot.ended:
                continue
            if slot.restart_at is not None:
                if now >= slot.restart_at:
                    slot.start()
                continue
            assert slot.proc is not None
            code = slot.proc.poll()
            if code is not None:
                _ended(slot, code, now)
            elif not slot.ready and slot.saw_ready():
                slot.ready = slot.served = True
                print(
                    f"weir: node {slot.node_id} ready, mqtt on {host}:{slot.mqtt_port} "
                    f"(pid {slot.proc.pid}, log {slot.files.log})",
                    flush=True,
                )
        if all(slot.ended for slot in slots):
            clean = all(slot.ended == "exited" for slot in slots)
            print("weir: no node left running; stopping", file=sys.stderr, flush=True)
            return EXIT_OK if clean else EXIT_FAILED
        time.sleep(POLL_S)
    return EXIT_OK


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited {code}"


def _ended(slot: Slot, code: int, now: float) -> None:
    """Node `slot` exited with `code`: leave it, give up on it, or restart it later."""
    assert slot.proc is not None
    pid, how = slot.proc.pid, _how(code)
    if code == 0:
        slot.ended = "exited"
        slot.files.remove_pid()
        print(f"weir: node {slot.node_id} (pid {pid}) exited 0 (drained or stopped); "
              "not restarted", flush=True)  # fmt: skip
        return
    if not slot.served:
        raise _StartFailed(
            f"node {slot.node_id} {how} before it was ready: {slot.last_log_line()} "
            f"(log {slot.files.log})"
        )
    while slot.restarts and now - slot.restarts[0] > RESTART_WINDOW_S:
        slot.restarts.popleft()
    if code == EXIT_BAD_CONFIG or len(slot.restarts) >= RESTARTS_PER_WINDOW:
        slot.ended = "given up"
        slot.files.remove_pid()
        why = (
            "bad configuration"
            if code == EXIT_BAD_CONFIG
            else f"{len(slot.restarts)} restarts within {RESTART_WINDOW_S:.0f} s"
        )
        print(
            f"weir: node {slot.node_id} (pid {pid}) {how}; giving up on it after {why} "
            f"(the others keep serving; log {slot.files.log})",
            file=sys.stderr,
            flush=True,
        )
        return
    slot.files.remove_pid()  # until it runs again
    delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** len(slot.restarts))
    slot.restarts.append(now)
    slot.restart_at = now + delay
    print(
        f"weir: node {slot.node_id} (pid {pid}) {how}; restarting it in {delay:.0f} s "
        f"(restart {len(slot.restarts)} within {RESTART_WINDOW_S:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def _stop_all(slots: list[Slot]) -> None:
    running = [s.proc for s in slots if s.proc is not None and s.proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for slot in slots:
        slot.files.remove_pid()

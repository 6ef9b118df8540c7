"""The idle scenario: open many connections that do nothing, and weigh them.

Theory of operation: one process may hold at most RLIMIT_NOFILE descriptors
(20,000 here, hard), so the connections are spread over `workers` processes,
each raising its soft limit to the hard one. One source address has about
28k ephemeral ports, so connection i binds 127.0.0.(2 + i % 249) before it
connects. Every worker opens its share with at most `concurrency` handshakes
in flight, reports ("connected", ...), and holds its connections until the
parent, having read the broker's VmRSS, says "close". RSS per connection is
(after - before) / connected: the broker's cost of an idle session, buffers
included. With `ports` > 1 connection i goes to port + i % ports (the nodes
of `weir up --nodes N`), and the RSS is that of every process listening on
those ports, summed. With credentials (`username`, `password`, or a JWT
signed with `jwt_secret` as the password; "{i}" stands for the connection's
index) the connect rate is that of an authenticating broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import uvloop

from bench import wire
from bench.client import BenchClient, open_client
from bench.errors import BenchError, BrokerUnavailable
from bench.pipe import receive
from bench.proc import find_listener_pids, is_local, rss_kib
from bench.report import Result

FIRST_SOURCE = 2
SOURCE_ADDRESSES = 249
"""127.0.0.2 .. 127.0.0.250."""
PER_WORKER_MAX = 19_000
"""Connections one worker may hold: the 20,000 descriptor hard limit less headroom."""
JWT_TTL_S = 3600
"""Seconds a --jwt-secret token is valid: longer than any run."""
DEFAULT_CONCURRENCY = 256
"""Handshakes in flight per worker: enough to keep the broker's accept loop busy,
few enough not to overflow its listen backlog."""


@dataclass(frozen=True, slots=True)
class IdleConfig:
    host: str
    port: int
    connections: int
    workers: int = 1
    duration: float = 10.0
    connect_timeout: float = 10.0
    concurrency: int = DEFAULT_CONCURRENCY
    version: int = wire.MQTT_311
    broker_pid: int | None = None
    ports: int = 1
    username: str | None = None  # "{i}" in it (or in password) becomes the connection's index
    password: str | None = None
    jwt_secret: str | None = None  # the password is an HS256 JWT (exp in 1 h, sub = user name)

    @property
    def broker(self) -> str:
        last = f"-{self.port + self.ports - 1}" if self.ports > 1 else ""
        return f"{self.host}:{self.port}{last}"

    def port_of(self, index: int) -> int:
        return self.port + index % self.ports

    def credentials(self, index: int) -> tuple[str | None, bytes | None]:
        """Connection `index`'s user name and password (None, None: anonymous)."""
        user = self.username.replace("{i}", str(index)) if self.username is not None else None
        if self.jwt_secret is not None:
            import jwt

            claims: dict[str, object] = {"exp": int(time.time()) + JWT_TTL_S}
            if user is not None:
                claims["sub"] = user
            return user, jwt.encode(claims, self.jwt_secret, algorithm="HS256").encode()
        if self.password is None:
            return user, None
        return user, self.password.replace("{i}", str(index)).encode()


@dataclass(frozen=True, slots=True)
class WorkerReport:
    connected: int
    failed: int
    first_ns: int
    last_ns: int
    error: str = ""


def source_address(index: int) -> str:
    return f"127.0.0.{FIRST_SOURCE + index % SOURCE_ADDRESSES}"


def raise_nofile_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit; return it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def shares(total: int, workers: int) -> list[int]:
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


async def _open_all(
    cfg: IdleConfig, run_id: str, first: int, count: int
) -> tuple[list[BenchClient], WorkerReport]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.duration
    gate = asyncio.Semaphore(cfg.concurrency)
    clients: list[BenchClient] = []
    errors: list[str] = []
    loopback = cfg.host.startswith("127.")

    async def one(index: int) -> None:
        async with gate:
            remaining = deadline - loop.time()
            if remaining <= 0:
                errors.append("duration over")
                return
            try:
                client = await open_client(
                    cfg.host,
                    cfg.port_of(index),
                    f"wb-{run_id}-i{index}",
                    version=cfg.version,
                    local_addr=(source_address(index), 0) if loopback else None,
                    wait_s=min(remaining, cfg.connect_timeout),
                    credentials=cfg.credentials(index),
                )
            except BenchError as exc:
                errors.append(str(exc))
                return
            clients.append(client)

    first_ns = time.monotonic_ns()
    await asyncio.gather(*(one(first + i) for i in range(count)))
    report = WorkerReport(
        connected=len(clients),
        failed=len(errors),
        first_ns=first_ns,
        last_ns=time.monotonic_ns(),
        error=errors[0] if errors else "",
    )
    return clients, report


def _worker_process(cfg: IdleConfig, run_id: str, first: int, count: int, conn: Connection) -> None:
    raise_nofile_limit()
    uvloop.run(_worker(cfg, run_id, first, count, conn))


async def _worker(cfg: IdleConfig, run_id: str, first: int, count: int, conn: Connection) -> None:
    clients, report = await _open_all(cfg, run_id, first, count)
    conn.send(report)
    try:
        await receive(conn, cfg.duration + cfg.connect_timeout + 60, "the parent process")
    except BenchError:
        pass
    finally:
        for client in clients:
            client.close()


def _collect(conns: list[Connection], wait_s: float) -> list[WorkerReport]:
    deadline = time.monotonic() + wait_s
    reports: list[WorkerReport] = []
    for conn in conns:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise BenchError(f"{len(conns) - len(reports)} idle workers did not report in time")
        try:
            reports.append(conn.recv())
        except EOFError as exc:
            raise BenchError("an idle worker process died") from exc
    return reports


def run_idle(cfg: IdleConfig, held: Callable[[], dict[str, Any]] | None = None) -> Result:
    """Open `cfg.connections` idle connections and report rate and the broker's RSS;
    `held` runs while they are all open (scrapes: bench.scrape), its figures added."""
    broker_pids = [cfg.broker_pid] if cfg.broker_pid else []
    if not broker_pids and is_local(cfg.host):
        # several with SO_REUSEPORT workers or --ports: RSS summed
        ports = range(cfg.port, cfg.port + cfg.ports)
        broker_pids = sorted({pid for port in ports for pid in find_listener_pids(port)})
    rss_before = _rss_sum(broker_pids)
    context = multiprocessing.get_context("spawn")
    run_id = secrets.token_hex(4)
    workers, conns = [], []
    first = 0
    try:
        for count in shares(cfg.connections, cfg.workers):
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=_worker_process, args=(cfg, run_id, first, count, theirs), daemon=True
            )
            proc.start()
            theirs.close()
            workers.append(proc)
            conns.append(ours)
            first += count
        reports = _collect(conns, cfg.duration + cfg.connect_timeout + 30)
        rss_after = _rss_sum(broker_pids)
        while_held = held() if held is not None else {}
    finally:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send("close")
        for proc in workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if not any(r.connected for r in reports):
        raise BrokerUnavailable(next((r.error for r in reports if r.error), "no connection"))
    result = _idle_result(cfg, broker_pids, reports, rss_before, rss_after)
    result.extra.update(while_held)
    return result


def _rss_sum(pids: list[int]) -> int | None:
    sizes = [rss_kib(pid) for pid in pids]
    if not sizes or None in sizes:
        return None
    return sum(s for s in sizes if s is not None)


def _idle_result(
    cfg: IdleConfig,
    broker_pids: list[int],
    reports: list[WorkerReport],
    rss_before: int | None,
    rss_after: int | None,
) -> Result:
    connected = sum(r.connected for r in reports)
    elapsed = (max(r.last_ns for r in reports) - min(r.first_ns for r in reports)) / 1e9
    per_connection = None
    if rss_before is not None and rss_after is not None and connected:
        per_connection = round((rss_after - rss_before) * 1024 / connected)
    errors = [r.error for r in reports if r.error]
    return Result(
        scenario="idle",
        qos=0,
        broker=cfg.broker,
        sent=0,
        expected=0,
        received=0,
        loss=0,
        duplicates=0,
        msg_per_s=0.0,
        duration_s=round(elapsed, 3),
        extra={
            "connections": cfg.connections,
            "connected": connected,
            "failed": sum(r.failed for r in reports),
            "connect_rate_per_s": round(connected / elapsed, 1) if elapsed else 0.0,
            "workers": cfg.workers,
            "ports": cfg.ports,
            "broker_pid": broker_pids[0] if broker_pids else None,
            "broker_pids": broker_pids,
            "broker_rss_before_kib": rss_before,
            "broker_rss_after_kib": rss_after,
            "broker_rss_per_connection_bytes": per_connection,
            **({"first_error": errors[0]} if errors else {}),
        },
    )

"""Dead-node takeover time: how long after a node's SIGKILL a survivor has
adopted all its persistent sessions and published their wills.

    python -m bench.takeover [--weir PATH] [--sessions 50000] [--redis URL]

Theory of operation. The tool talks to the brokers only as a user would:
MQTT to the nodes, redis-py to their Redis, a signal to a process, so it
measures any tree whose `weir up` takes --node-id/--redis/--kafka/
--cluster-ttl (today's, or /work/wt/before with
`--weir /work/wt/before/.venv/bin/weir`, for the keyspace-scan figure):

1. a redis-server of its own (or `--redis URL`, e.g. a `redis+cluster://`
   one), one embedded Kafka, and two nodes A and B on them;
2. `--sessions` MQTT 3.1.1 clients connect to A with clean session 0 and a
   will (QoS 1, delay none, topic `takeover/will/<i>`) and stay connected,
   from source addresses 127.0.0.2-250 (ephemeral ports run out past ~28,000
   per address); a clean subscriber on B takes `takeover/will/#`;
3. SIGKILL A; from that moment (t = 0):
   - `detected_s`: B's first will (it noticed A's death: about the cluster
     TTL);
   - `wills_s`: the last of the N wills at B's subscriber;
   - `adopted_s`: no session hash left online at A (polled every
     `POLL_S` with HMGET of `{c:<id>}:s` node/online in pipelined chunks,
     the session key layout of both trees);
   - `takeover_s`: wills_s - detected_s, the dead-node work itself.
With `--stand-in`, step 2 is `bench.standin` (no sockets, the same Redis
state): for more sessions than a process here has open files (~19,900).
One JSON line on stdout; progress on stderr. Nothing else runs meanwhile:
run it on a quiet machine (the figures are CPU-bound on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_server import RedisServer
from services.ports import free_port
from services.store.redis import connect

DEFAULT_SESSIONS = 50_000
CLUSTER_TTL_S = 4.0  # the nodes' heartbeat TTL: a death is noticed about this late
CONCURRENCY = 500  # CONNECTs in flight at once
READY_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 30.0
POLL_S = 0.25  # adoption poll period (one pipelined HMGET round per chunk)
CHUNK = 5_000  # HMGETs per pipeline
SOURCES = 249  # 127.0.0.2 .. 127.0.0.250
WILL_TOPIC = "takeover/will/"
TAKEOVER_TIMEOUT_S = 600.0
WILL_QUEUE = 1_000_000  # B's per-session queue bound (default 1,000: a burst of wills overflows it)


def _string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def connect_with_will(client_id: str, will_topic: str) -> bytes:
    """3.1.1 CONNECT, clean session 0, keepalive 0, a QoS 1 will."""
    flags = 0x0C  # will, QoS 1 (a QoS 0 burst to one reader may be dropped), not retained
    body = _string("MQTT") + bytes([4, flags]) + (0).to_bytes(2, "big")
    body += _string(client_id) + _string(will_topic) + _string(client_id)
    return _packet(0x10, body)


def connect_clean(client_id: str) -> bytes:
    return _packet(0x10, _string("MQTT") + bytes([4, 0x02]) + (0).to_bytes(2, "big")
                   + _string(client_id))  # fmt: skip


class Holder(asyncio.Protocol):
    """One session's connection: CONNECT, wait for CONNACK, then stay idle."""

    def __init__(self, hello: bytes) -> None:
        self.hello = hello
        self.acked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.hello)

    def data_received(self, data: bytes) -> None:
        if self.acked.done():
            return
        self.buf += data
        if len(self.buf) >= 4:
            self.acked.set_result(self.buf[0] == 0x20 and self.buf[3] == 0)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.acked.done():
            self.acked.set_result(False)


class WillCounter(asyncio.Protocol):
    """B's subscriber: the time each distinct will topic first arrived."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.seen: dict[bytes, float] = {}
        self.subacked = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(connect_clean(f"takeover-watch-{os.getpid()}"))
        sub = (1).to_bytes(2, "big") + _string(WILL_TOPIC + "#") + b"\x01"
        transport.write(_packet(0x82, sub))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        now = time.monotonic()
        while len(self.buf) >= 2:
            length, mult, at = 0, 1, 1
            while True:
                if at >= len(self.buf):
                    return
                byte = self.buf[at]
                length += (byte & 0x7F) * mult
                mult *= 128
                at += 1
                if not byte & 0x80:
                    break
            if len(self.buf) < at + length:
                return
            first = self.buf[0]
            kind, body = first >> 4, bytes(self.buf[at : at + length])
            del self.buf[: at + length]
            if kind == 9 and not self.subacked.done():
                self.subacked.set_result(True)
            elif kind == 3:
                size = int.from_bytes(body[:2], "big")
                topic = body[2 : 2 + size]
                if first & 0x06:  # QoS 1: acknowledged, or the window stops the flow
                    self.transport.write(b"\x40\x02" + body[2 + size : 4 + size])
                self.seen.setdefault(topic, now)


def _log(text: str) -> None:
    print(f"takeover: {text}", file=sys.stderr, flush=True)


def _has_http_port(weir: str) -> bool:
    """Whether this tree's `weir up` has an HTTP API port (13351af has none)."""
    shown = subprocess.run([weir, "up", "--help"], capture_output=True, text=True, check=False)
    return "--http-port" in shown.stdout


class Node:
    def __init__(self, weir: str, node_id: str, redis_url: str, kafka: str, data: Path) -> None:
        self.port = free_port()
        self.log = data / f"{node_id}.log"
        args = [weir, "up", "--host", "127.0.0.1", "--mqtt-port", str(self.port),
                "--ws-port", "off", "--node-id", node_id,
                "--data-dir", str(data / node_id), "--redis", redis_url, "--kafka", kafka,
                "--cluster-ttl", str(CLUSTER_TTL_S),
                # the one will subscriber on B takes every will: none dropped at its queue bound
                "--queue-limit", str(WILL_QUEUE)]  # fmt: skip
        if _has_http_port(weir):  # two nodes on one host: not both on 18083
            args += ["--http-port", "0"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    async def ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"takeover: node exited: {self.log.read_text()[-400:]}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"takeover: no node on :{self.port} in {READY_TIMEOUT_S} s")
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _standin(redis_url: str, sessions: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.standin", "--redis", redis_url, "--node-id", "A",
         "--sessions", str(sessions), "--ttl", str(CLUSTER_TTL_S)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


async def _hold(port: int, count: int, run: str) -> tuple[list[Holder], float]:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONCURRENCY)
    holders: list[Holder] = []
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        cid = f"tk-{run}-{i}"
        async with gate:
            try:
                _, proto = await loop.create_connection(
                    lambda: Holder(connect_with_will(cid, f"{WILL_TOPIC}{i}")), "127.0.0.1", port,
                    local_addr=(f"127.0.0.{2 + i % SOURCES}", 0),
                )  # fmt: skip
                ok = await asyncio.wait_for(proto.acked, CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                ok = False
            if ok:
                holders.append(proto)
            else:
                failed += 1

    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    if failed:
        raise SystemExit(f"takeover: {failed} of {count} sessions did not connect")
    return holders, time.monotonic() - began


async def _online_at(client: aioredis.Redis, ids: list[str], node: bytes) -> int:
    left = 0
    for at in range(0, len(ids), CHUNK):
        pipe = client.pipeline(transaction=False)
        for cid in ids[at : at + CHUNK]:
            pipe.hmget("{c:" + cid + "}:s", ["node", "online"])
        for owner, online in await pipe.execute():
            left += owner == node and online == b"1"
    return left


async def run(args: argparse.Namespace) -> dict[str, Any]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.sessions + 1000 and not args.stand_in:
        raise SystemExit(
            f"takeover: {args.sessions} sessions need more open files than {hard} "
            "(--stand-in plays node A in Redis instead)"
        )
    data = Path(tempfile.mkdtemp(prefix="weir-takeover-"))
    started: list[Any] = []
    nodes: list[Node] = []
    standin: subprocess.Popen[str] | None = None
    try:
        redis_url = args.redis
        if redis_url is None:
            server = RedisServer(data / "redis").start()
            started.append(server)
            redis_url = server.url
        kafka = EmbeddedKafka().start()
        started.append(kafka)
        b = Node(args.weir, "B", redis_url, kafka.bootstrap, data)
        nodes.append(b)
        await b.ready()
        loop = asyncio.get_running_loop()
        _, watcher = await loop.create_connection(WillCounter, "127.0.0.1", b.port)
        await asyncio.wait_for(watcher.subacked, CONNECT_TIMEOUT_S)
        if args.stand_in:
            _log(f"a stand-in for A claims {args.sessions} persistent sessions with wills")
            began = time.monotonic()
            standin = _standin(redis_url, args.sessions)
            assert standin.stdout is not None
            line = await asyncio.to_thread(standin.stdout.readline)
            if not line.startswith("ready "):
                raise SystemExit(f"takeover: the stand-in did not start: {line!r}")
            run_id, connect_s = line.split()[1], time.monotonic() - began
            victim: subprocess.Popen[Any] = standin
        else:
            a = Node(args.weir, "A", redis_url, kafka.bootstrap, data)
            nodes.append(a)
            await a.ready()
            run_id = os.urandom(3).hex()
            _log(f"connecting {args.sessions} persistent sessions with wills to A")
            holders, connect_s = await _hold(a.port, args.sessions, run_id)
            _log(f"{len(holders)} connected in {connect_s:.1f} s")
            victim = a.process
        ids = [f"tk-{run_id}-{i}" for i in range(args.sessions)]
        client = connect(redis_url, 30.0)
        online = await _online_at(client, ids, b"A")
        _log(f"{online} online at A; SIGKILL A")
        killed = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        adopted_s = None
        deadline = killed + TAKEOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            if adopted_s is None and not await _online_at(client, ids, b"A"):
                adopted_s = time.monotonic() - killed
            if adopted_s is not None and len(watcher.seen) >= args.sessions:
                break
            await asyncio.sleep(POLL_S)
        await client.aclose()
        times = sorted(watcher.seen.values())
        first = times[0] - killed if times else None
        last = times[-1] - killed if len(times) >= args.sessions else None
        return {
            "scenario": "takeover", "weir": args.weir, "sessions": args.sessions,
            "redis": "cluster" if "cluster" in redis_url else "one",
            "node_a": "stand-in" if args.stand_in else "weir up",
            "cluster_ttl_s": CLUSTER_TTL_S, "connect_s": round(connect_s, 2),
            "wills": len(times), "detected_s": _r(first), "wills_s": _r(last),
            "adopted_s": _r(adopted_s),
            "takeover_s": _r(last - first if last is not None and first is not None else None),
        }  # fmt: skip
    finally:
        if standin is not None and standin.poll() is None:
            standin.kill()
        for node in nodes:
            node.stop()
        for service in reversed(started):
            service.stop()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
        else:
            _log(f"logs kept in {data}")


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main(argv: list[str] | None = None) -> None:
    doc = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.takeover", description=doc)
    parser.add_argument("--weir", default=str(Path(sys.executable).parent / "weir"),
                        help="the weir executable of the tree to measure")  # fmt: skip
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS)
    parser.add_argument("--redis", help="use this Redis (redis:// or redis+cluster://); "
                        "default: a redis-server of the run's own")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the nodes' logs")
    parser.add_argument("--stand-in", action="store_true",
                        help="play node A in Redis (bench.standin) instead of running it: "
                        "for more sessions than one process has sockets")  # fmt: skip
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error("--sessions must be positive")
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()

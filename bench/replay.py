"""Replay benchmark: how long a node takes to rebuild its view from the log.

Default mode: produces N Subscribed events over C clients (N/C filters
each, versions 1..N/C per client) into an embedded Tansu broker (or --kafka
HOST:PORT), then times a replay to partition EOF into a fresh ClusterView:
seconds to done, events/s, and the memory the view holds (RSS growth,
measured after the consumer is closed).

`--node` mode measures the real node: an embedded Kafka and a redis-server
are started; each of C persistent clients gets a SessionOpened, N/C
Subscribed events (filters like ``fleet/<client>/cmd/#``) and a
SessionClosed that keeps its session (offline, as after a node restart);
then ``python -m services up`` runs as a subprocess on them. Measured: wall
time from process start to its ready line, the node's own "replayed N
events in S s" log line, and its VmRSS after ready. Then it checks that the
node really holds the tree: a QoS 1 PUBLISH to ``fleet/<client>/cmd/x`` of
one replayed client (whose session hash the bench put in Redis, as that
client's node would have) must land in that client's Redis queue.
Target: 1,000,000 events in <= 30 s to ready.

    python -m bench.replay [--node] [--events 1000000] [--clients 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import Producer

from services.embedded.kafka import EmbeddedKafka
from services.embedded.redis_server import RedisServer
from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import Event, SessionClosed, SessionOpened, Subscribed, encode
from services.ports import free_port
from services.session.redis import KEY_SUFFIXES, RedisSessionStore, client_keys, connect
from services.state.view import ClusterView

PRODUCE_TIMEOUT_S = 300.0
NODE_READY_TIMEOUT_S = 600.0  # the target is 30 s; give a slow run room to report its figure
CHECK_TIMEOUT_S = 10.0
EXPIRY_S = 7 * 24 * 3600  # the bench clients' session expiry: a week offline
# Per-client filters, in order: the first N/C of them (cycled with a suffix past the end).
FILTERS = (
    "fleet/{c}/cmd/#",
    "fleet/{c}/cfg/+",
    "fleet/{c}/ota/offer",
    "fleet/{c}/alerts/+/high",
    "fleet/{c}/ping",
    "site/{s}/broadcast/#",
    "fleet/{c}/rpc/+/request",
    "fleet/{c}/shadow/delta",
    "fleet/{c}/logs/level",
    "fleet/{c}/time/sync",
)
CHECK_TOPIC = "fleet/{c}/cmd/bench-check"
# The node loggers the bench subprocess enables (replay, and start from the state
# store for bench.streams); the rest of `weir up` is unchanged.
NODE_ENTRY = (
    "import logging, sys\n"
    "h = logging.StreamHandler(); h.setFormatter(logging.Formatter('%(message)s'))\n"
    "for name in ('weir.logstate', 'weir.bootstrap'):\n"
    "    lg = logging.getLogger(name); lg.addHandler(h); lg.setLevel(logging.INFO)\n"
    "from services.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
REPLAYED = re.compile(r"replayed (\d+) events in ([\d.]+) s")


@dataclass(frozen=True, slots=True)
class Result:
    events: int
    clients: int
    partitions: int
    produce_s: float
    replay_s: float
    events_per_s: float
    view_rss_mib: float
    subscriptions: int


@dataclass(frozen=True, slots=True)
class NodeResult:
    mode: str
    events: int  # all events in the log: Subscribed plus 2 session events per client
    subscribed: int
    clients: int
    partitions: int
    produce_s: float
    ready_s: float  # process start to its ready line
    node_replay_s: float  # the node's own "replayed N events in S s"
    node_replayed: int
    events_per_s: float  # node_replayed / node_replay_s
    events_per_s_to_ready: float  # events / ready_s
    node_rss_mib: float  # VmRSS after ready
    node_hwm_mib: float  # VmHWM: the peak during replay
    check_client: str
    check_queued: int  # messages in check_client's Redis queue after the PUBLISH


def rss_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def client_name(c: int) -> str:
    return f"client-{c:06d}"


def subscribed_events(events: int, clients: int) -> Iterator[Event]:
    """The default mode's workload: filter v of client c, versions 1..N/C."""
    per_client = max(1, events // clients)
    n = 0
    for v in range(1, per_client + 1):
        for c in range(clients):
            if n == events:
                return
            yield Subscribed(
                client_id=client_name(c),
                version=v,
                node="bench",
                ts_ms=v,
                filter=f"site/{c % 97}/device/{c}/ch/{v}",
                qos=1,
            )
            n += 1


def fleet_filter(c: int, i: int) -> str:
    name = client_name(c)
    base = FILTERS[i % len(FILTERS)].format(c=name, s=c % 97)
    return base if i < len(FILTERS) else f"{base}/{i // len(FILTERS)}".replace("#/", "")


def fleet_events(events: int, clients: int) -> Iterator[Event]:
    """The --node workload, client by client: SessionOpened (v1), its
    Subscribed events (v2...), SessionClosed keeping the session (last v).
    `events` Subscribed in all, spread evenly over the clients."""
    base, extra = divmod(events, clients)
    ts = int(time.time() * 1000)
    for c in range(clients):
        client_id = client_name(c)
        yield SessionOpened(
            client_id=client_id,
            version=1,
            node="bench-old",
            ts_ms=ts,
            epoch=1,
            clean_start=False,
            expiry_s=EXPIRY_S,
            protocol=5,
            peer="127.0.0.1:1",
        )
        subs = base + (1 if c < extra else 0)
        for i in range(subs):
            yield Subscribed(
                client_id=client_id,
                version=2 + i,
                node="bench-old",
                ts_ms=ts,
                filter=fleet_filter(c, i),
                qos=1,
            )
        yield SessionClosed(
            client_id=client_id,
            version=2 + subs,
            node="bench-old",
            ts_ms=ts,
            reason="normal",
            expiry_s=EXPIRY_S,
        )


def produce(bootstrap: str, prefix: str, events: Iterator[Event]) -> tuple[float, int]:
    """(seconds, records) to produce `events` with the real encoder."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 200_000,
        }
    )
    failures = 0

    def delivered(err: object, _msg: object) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.monotonic()
    n = 0
    for event in events:
        suffix, key, value = encode(event)
        while True:
            try:
                producer.produce(
                    prefix + suffix, key=key.encode(), value=value, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(PRODUCE_TIMEOUT_S)
    if left or failures:
        raise RuntimeError(f"produce: {left} undelivered, {failures} failed")
    return time.monotonic() - started, n


async def replay(bootstrap: str, prefix: str, partitions: int) -> tuple[float, ClusterView, int]:
    gc.collect()
    log = KafkaEventLog(KafkaSettings(bootstrap, topic_prefix=prefix, partitions=partitions))
    view = ClusterView()
    started = time.monotonic()
    count = await log.replay(view.apply)
    elapsed = time.monotonic() - started
    await log.close()
    return elapsed, view, count


def make_topics(bootstrap: str, prefix: str, partitions: int) -> None:
    setup = KafkaEventLog(KafkaSettings(bootstrap, topic_prefix=prefix, partitions=partitions))
    asyncio.run(setup.ensure_topics())
    asyncio.run(setup.close())


def run(events: int, clients: int, partitions: int, kafka: str | None) -> Result:
    broker = None if kafka else EmbeddedKafka().start()
    bootstrap = kafka or (broker.bootstrap if broker else "")
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    try:
        make_topics(bootstrap, prefix, partitions)
        produce_s, _ = produce(bootstrap, prefix, subscribed_events(events, clients))
        gc.collect()
        before = rss_mib()
        replay_s, view, count = asyncio.run(replay(bootstrap, prefix, partitions))
        gc.collect()
        grown = rss_mib() - before
        if count != events:
            raise RuntimeError(f"replayed {count} events, produced {events}")
        subs = sum(len(s) for s in view.all_subscriptions().values())
        return Result(
            events, clients, partitions, produce_s, replay_s, count / replay_s, grown, subs
        )
    finally:
        if broker is not None:
            broker.stop()


# -- --node mode ----------------------------------------------------------------


async def _give_redis_session(url: str, client_id: str) -> None:
    """The session hash that client's node would have left in Redis (offline, kept)."""
    store = RedisSessionStore(connect(url))
    try:
        claim = await store.claim(client_id, "bench-old", False, EXPIRY_S)
        await store.release(client_id, claim.epoch, EXPIRY_S)
    finally:
        await store.close()


async def _queued(url: str, client_id: str) -> int:
    client = connect(url)
    try:
        order = client_keys(client_id)[KEY_SUFFIXES.index("o")]
        return int(await client.zcard(order))
    finally:
        await client.aclose()


def _string(s: str) -> bytes:
    raw = s.encode()
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    length, n = bytearray(), len(body)
    while True:
        n, digit = divmod(n, 128)
        length.append(digit | (0x80 if n else 0))
        if not n:
            return bytes([first]) + bytes(length) + body


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError("check: the node closed the connection")
        data += chunk
    return data


def publish_qos1(port: int, topic: str) -> None:
    """One MQTT 3.1.1 QoS 1 PUBLISH from a clean client; returns after its PUBACK."""
    with socket.create_connection(("127.0.0.1", port), timeout=CHECK_TIMEOUT_S) as sock:
        connect_body = _string("MQTT") + bytes([4, 0x02, 0, 60]) + _string("bench-check")
        sock.sendall(_packet(0x10, connect_body))
        if _read_exactly(sock, 4) != b"\x20\x02\x00\x00":
            raise RuntimeError("check: CONNECT refused")
        sock.sendall(_packet(0x32, _string(topic) + b"\x00\x01" + b"bench"))
        if _read_exactly(sock, 4) != b"\x40\x02\x00\x01":
            raise RuntimeError("check: no PUBACK for the check PUBLISH")
        sock.sendall(b"\xe0\x00")


def _drain(stream: object, lines: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)


def start_node(
    redis_url: str, bootstrap: str, prefix: str, port: int, data_dir: Path
) -> tuple[subprocess.Popen[str], float, list[str]]:
    """The node process, the seconds to its ready line, and its stderr so far (a live list)."""
    args = [
        "up",
        "--node-id",
        "bench-node",
        "--host",
        "127.0.0.1",
        "--redis",
        redis_url,
        "--kafka",
        bootstrap,
        "--kafka-topic-prefix",
        prefix,
        "--mqtt-port",
        str(port),
        "--ws-port",
        "off",
        "--http-port",
        "0",  # never 18083, which a node of another run may hold
        "--data-dir",
        str(data_dir),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE_ENTRY, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    err: list[str] = []
    threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True).start()
    assert proc.stdout is not None
    out: list[str] = []
    reader = threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True)
    reader.start()
    deadline = started + NODE_READY_TIMEOUT_S
    while not any(" ready, " in line for line in out):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"node not ready: {''.join(out + err)[-2000:]}")
        time.sleep(0.01)
    return proc, time.monotonic() - started, err


def run_node(events: int, clients: int, partitions: int) -> NodeResult:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    check = client_name(clients // 2)
    with tempfile.TemporaryDirectory(prefix="weir-bench-replay-") as tmp:
        redis = RedisServer(Path(tmp) / "redis").start()
        kafka = EmbeddedKafka().start()
        proc: subprocess.Popen[str] | None = None
        try:
            make_topics(kafka.bootstrap, prefix, partitions)
            produce_s, records = produce(kafka.bootstrap, prefix, fleet_events(events, clients))
            asyncio.run(_give_redis_session(redis.url, check))
            port = free_port()
            proc, ready_s, err = start_node(redis.url, kafka.bootstrap, prefix, port, Path(tmp))
            rss, hwm = rss_mib(proc.pid), rss_mib(proc.pid, "VmHWM")
            found = next((m for line in err if (m := REPLAYED.search(line))), None)
            if found is None:
                raise RuntimeError(f"node printed no replay line: {''.join(err)[-2000:]}")
            replayed, replay_s = int(found[1]), float(found[2])
            if replayed != records:
                raise RuntimeError(f"node replayed {replayed} events, the log holds {records}")
            publish_qos1(port, CHECK_TOPIC.format(c=check))
            queued = asyncio.run(_queued(redis.url, check))
            if queued != 1:
                raise RuntimeError(f"check: {check}'s Redis queue holds {queued}, expected 1")
            return NodeResult(
                mode="node",
                events=records,
                subscribed=events,
                clients=clients,
                partitions=partitions,
                produce_s=round(produce_s, 2),
                ready_s=round(ready_s, 2),
                node_replay_s=replay_s,
                node_replayed=replayed,
                events_per_s=round(replayed / max(replay_s, 0.05)),
                events_per_s_to_ready=round(records / ready_s),
                node_rss_mib=round(rss, 1),
                node_hwm_mib=round(hwm, 1),
                check_client=check,
                check_queued=queued,
            )
        finally:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(CHECK_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            kafka.stop()
            redis.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--clients", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--kafka", help="HOST:PORT of a broker (default: start embedded Tansu)")
    p.add_argument(
        "--node",
        action="store_true",
        help="measure a `weir up` node process (embedded Kafka and redis-server started here)",
    )
    args = p.parse_args(argv)
    if args.node:
        if args.kafka:
            p.error("--node starts its own Kafka; --kafka is for the view mode")
        node = run_node(args.events, args.clients, args.partitions)
        print(json.dumps(asdict(node)), flush=True)
        print(
            f"node replayed {node.node_replayed:,} events ({node.subscribed:,} subscriptions, "
            f"{node.clients:,} clients) in {node.node_replay_s:.1f} s: "
            f"{node.events_per_s:,} events/s; ready {node.ready_s:.1f} s after start; "
            f"RSS {node.node_rss_mib:.0f} MiB (peak {node.node_hwm_mib:.0f} MiB); "
            f"produce took {node.produce_s:.1f} s",
            file=sys.stderr,
        )
        return 0
    result = run(args.events, args.clients, args.partitions, args.kafka)
    print(json.dumps(asdict(result)))
    print(
        f"replayed {result.events:,} events ({result.clients:,} clients) in "
        f"{result.replay_s:.1f} s: {result.events_per_s:,.0f} events/s, "
        f"view about {result.view_rss_mib:.0f} MiB; produce took {result.produce_s:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

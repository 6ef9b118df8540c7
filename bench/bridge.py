"""QoS 1 through a Kafka bridge: throughput and PUBACK latency, per bridge mode.

    python -m bench.bridge [--seconds 5] [--publishers 4] [--window 32] [--payload 64]
                           [--qos 1|0]
    python -m bench.bridge --modes in [--records 20000]

For each mode (no bridge, async, sync) a fresh `weir up` (embedded Redis and
Kafka, a bridge table for `bench/#` unless "none") runs on a free port, and
`publishers` raw MQTT 3.1.1 clients each keep `window` QoS 1 PUBLISHes
unacknowledged for `seconds`. Reported: PUBACKs per second, the PUBACK
latency (send to PUBACK, per message) p50 / p99, and the bridge's own
figures read from Kafka afterwards (records in the topic). `--qos 0`: each
publisher sends `window` QoS 0 PUBLISHes and a PINGREQ, and the next
`window` once the PINGRESP came (the node has taken the ones before);
reported: messages per second and the PINGREQ round trip p50 / p99.

Mode "in" (Kafka -> MQTT, not in the default modes): a `[[bridge.kafka_in]]`
table publishes the records of a 4-partition topic to one raw QoS 1
subscriber; once a first record came through (the consumer group joined),
`records` records are produced as fast as Kafka takes them. Reported:
records per second at the subscriber (first produce to last delivery) and
the produce-to-delivery latency p50 / p99 (wall clock, one machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import wire

READY = re.compile(r"ready, mqtt on [^ ]+:(\d+)")
KAFKA = re.compile(r"kafka (\S+?)[;)]")
MODES = ("none", "async", "sync")  # the default; "in" measures Kafka -> MQTT
IN_TOPIC = "bench-in"
IN_PARTITIONS = 4
JOIN_S = 60.0  # the first record's wait: topic metadata (10 s) and the group join


async def publisher(port: int, name: str, seconds: float, window: int, payload: bytes,
                    latencies: list[float], qos: int = 1) -> int:  # fmt: skip
    """One client: `window` QoS 1 PUBLISHes out at a time; returns how many were
    acked (QoS 0: `qos0_publisher`'s, how many the node took)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(wire.connect(name))
    parser = wire.FrameParser()
    while not (frames := parser.feed(await reader.read(65536))):
        pass
    assert frames[0][1][1] == 0, f"CONNACK {frames[0][1]!r}"
    if qos == 0:
        return await qos0_publisher(reader, writer, parser, name, seconds, window, payload,
                                    latencies)  # fmt: skip
    sent_at: dict[int, float] = {}
    seq = acked = 0
    end = time.perf_counter() + seconds

    def send() -> None:
        nonlocal seq
        pid = wire.packet_id_for(seq)
        sent_at[pid] = time.perf_counter()
        writer.write(wire.publish(f"bench/{name}", payload, qos=1, packet_id=pid))
        seq += 1

    for _ in range(window):
        send()
    while time.perf_counter() < end or sent_at:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("the node closed the connection")
        now = time.perf_counter()
        for first, body in parser.feed(data):
            if first >> 4 != 4:  # PUBACK
                continue
            pid = int.from_bytes(body[:2], "big")
            latencies.append(now - sent_at.pop(pid))
            acked += 1
            if now < end:
                send()
    writer.write(wire.DISCONNECT_PACKET)
    writer.close()
    return acked


async def qos0_publisher(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         parser: wire.FrameParser, name: str, seconds: float, window: int,
                         payload: bytes, latencies: list[float]) -> int:  # fmt: skip
    """`window` QoS 0 PUBLISHes and a PINGREQ, the next ones once its PINGRESP
    came; the PINGREQ's round trip per batch in `latencies`."""
    batch = b"".join(wire.publish(f"bench/{name}", payload, qos=0) for _ in range(window))
    batch += wire.PINGREQ_PACKET
    taken = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sent = time.perf_counter()
        writer.write(batch)
        while not any(first >> 4 == wire.PINGRESP >> 4 for first, _ in parser.feed(
                await _read(reader))):  # fmt: skip
            pass
        latencies.append(time.perf_counter() - sent)
        taken += window
    writer.write(wire.DISCONNECT_PACKET)
    writer.close()
    return taken


async def _read(reader: asyncio.StreamReader) -> bytes:
    data = await reader.read(65536)
    if not data:
        raise ConnectionError("the node closed the connection")
    return data


def start_node(
    mode: str, data_dir: Path, linger_ms: int | None
) -> tuple[subprocess.Popen[str], int, str]:
    config = data_dir / "weir.toml"
    linger = f"linger_ms = {linger_ms}\n" if linger_ms is not None else ""
    if mode == "in":
        config.write_text(f'[[bridge.kafka_in]]\nname = "bench"\ntopics = ["{IN_TOPIC}"]\n'
                          'mqtt_topic = "bench/in/${partition}"\nqos = 1\n')  # fmt: skip
    else:
        config.write_text("" if mode == "none" else (
            '[[bridge.kafka_out]]\nname = "bench"\nfilter = "bench/#"\ntopic = "bench"\n'
            f'mode = "{mode}"\n{linger}'))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    node = subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--config", str(config), "--host", "127.0.0.1",
         "--mqtt-port", "0", "--ws-port", "off", "--http-port", "0",
         "--data-dir", str(data_dir / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert node.stdout is not None
    for line in node.stdout:
        found = READY.search(line)
        if found:
            threading.Thread(target=node.stdout.read, daemon=True).start()  # keep draining
            bootstrap = KAFKA.search(line)
            return node, int(found.group(1)), bootstrap.group(1) if bootstrap else ""
    node.wait()
    raise RuntimeError(f"weir up ({mode}) did not start")


def records_in(bootstrap: str, topic: str) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-bridge",
                         "enable.partition.eof": True, "enable.auto.commit": False})  # fmt: skip
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        left, count = set(parts), 0
        while left:
            for m in consumer.consume(1000, timeout=1.0):
                err = m.error()
                if err is None:
                    count += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
        return count
    finally:
        consumer.close()


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of the node and of its children (redis-server, Kafka) by name."""
    import psutil

    node = psutil.Process(pid)
    out: dict[str, float] = {}
    for proc in (node, *node.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            name = "node" if proc.pid == pid else proc.name()
            out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_mode(mode: str, args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="weir-bench-bridge-") as tmp:
        node, port, bootstrap = start_node(mode, Path(tmp), args.linger_ms)
        try:
            latencies: list[float] = []
            payload = bytes(args.payload)
            before = cpu_seconds(node.pid)
            acked = await asyncio.gather(*(
                publisher(port, f"p{i}", args.seconds, args.window, payload, latencies,
                          args.qos)
                for i in range(args.publishers)))  # fmt: skip
            cpu = {k: v - before.get(k, 0.0) for k, v in cpu_seconds(node.pid).items()}
            total = sum(acked)
            unit = "PUBACK/s, latency" if args.qos else "QoS 0 msg/s, PINGREQ round trip"
            line = (f"{mode:>5}: {total / args.seconds:8.0f} {unit} p50 "
                    f"{percentile(latencies, 0.5) * 1000:6.2f} ms, p99 "
                    f"{percentile(latencies, 0.99) * 1000:6.2f} ms; CPU s "
                    + " ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items())))  # fmt: skip
            if mode != "none" and bootstrap:
                line += f"; records in Kafka {records_in(bootstrap, 'bench')} of {total}"
            return line
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()


def produce_stamped(bootstrap: str, count: int) -> None:
    """`count` records whose values are the wall-clock ns they were produced at."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "partitioner": "murmur2_random"})  # fmt: skip
    for n in range(count):
        while True:
            try:
                producer.produce(IN_TOPIC, b"%d" % time.time_ns(), b"k%d" % n)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(60) == 0, "records not acknowledged by Kafka"


async def run_in(args: argparse.Namespace) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory(prefix="weir-bench-bridge-") as tmp:
        node, port, bootstrap = start_node("in", Path(tmp), None)
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic(IN_TOPIC, num_partitions=IN_PARTITIONS)])[
                IN_TOPIC].result(timeout=10)  # fmt: skip
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(wire.connect("bench-sub") + wire.subscribe(1, "bench/in/#", 1))
            parser = wire.FrameParser()
            latencies: list[float] = []

            async def receive(count: int) -> None:
                while count:
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionError("the node closed the connection")
                    now = time.time_ns()
                    for first, body in parser.feed(data):
                        if first >> 4 != 3:  # PUBLISH
                            continue
                        pid, at = wire.publish_body_offsets(body, (first >> 1) & 3,
                                                            wire.MQTT_311)  # fmt: skip
                        if pid:
                            writer.write(wire.puback(pid))
                        latencies.append((now - int(bytes(body[at:]))) / 1e9)
                        count -= 1

            await asyncio.to_thread(produce_stamped, bootstrap, 1)
            await asyncio.wait_for(receive(1), JOIN_S)
            latencies.clear()
            began = time.perf_counter()
            producing = asyncio.create_task(asyncio.to_thread(produce_stamped, bootstrap,
                                                              args.records))  # fmt: skip
            await asyncio.wait_for(receive(args.records), JOIN_S + args.records / 100)
            took = time.perf_counter() - began
            await producing
            writer.write(wire.DISCONNECT_PACKET)
            writer.close()
            return (f"   in: {args.records / took:8.0f} records/s to one QoS 1 subscriber, "
                    f"produce-to-delivery p50 {percentile(latencies, 0.5) * 1000:6.2f} ms, "
                    f"p99 {percentile(latencies, 0.99) * 1000:6.2f} ms")  # fmt: skip
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--window", type=int, default=32, help="QoS 1 in flight per publisher")
    parser.add_argument("--payload", type=int, default=64, help="bytes per message")
    parser.add_argument("--qos", type=int, choices=[0, 1], default=1,
                        help="0: QoS 0 batches of --window, each closed by a PINGREQ")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES), help="none, async, sync, in")
    parser.add_argument("--linger-ms", type=int, help="the bridge's linger_ms (default: its own)")
    parser.add_argument("--records", type=int, default=20_000, help="records of mode in")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        run = run_in(args) if mode == "in" else run_mode(mode, args)
        print(asyncio.run(run), flush=True)


if __name__ == "__main__":
    main()

"""A rule's end-to-end latency: from an MQTT PUBLISH to the alert it causes.

    python -m bench.rules [--samples 30] [--interval-s 2] [--trigger-s 1] [--job-log FILE]

Starts a `weir up` (embedded Redis and Kafka) with docs/rules.md's example
(the `tele/#` -> `mqtt-telemetry` bridge, sync; the `hot` rule, with one
more column, `max(json.seq) AS seq`, so each alert names the reading that
caused it; the `alerts` -> `alerts/${key}` Kafka -> MQTT bridge), and
`weir streams run rules` beside it with `--trigger-s`.
One device publishes a reading over the threshold (QoS 1, `{"temp": 35,
"seq": N}`) every `interval-s` plus a random fraction of the trigger, so
readings fall at every phase of it. In update mode each reading changes its
window's row, so each causes an alert; the latency of reading N is from just
before its PUBLISH is written to when a record with seq N is read:

- from the Kafka topic `alerts` (a consumer in this process, 10 ms fetch
  wait): PUBLISH -> bridge -> Kafka -> rule -> Kafka;
- at an MQTT subscriber of `alerts/#`, where the Kafka -> MQTT bridge
  publishes each alert to `alerts/<clientid>`: the whole way back to a
  device.

The first alert (Spark's first batches start its Python workers) is a
warm-up and not counted. Two readings in one micro-batch give one alert,
for the later; the earlier is counted as merged, not as a latency.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Final

from bench import wire
from bench.bridge import KAFKA, READY, percentile

STARTED = re.compile(r"rule hot: started")
TEMP: Final = 35.0  # over the rule's threshold (30), every reading
WARMUP_TIMEOUT_S: Final = 180.0  # Spark's start (10-15 s here) and its first batches
SAMPLE_TIMEOUT_S: Final = 30.0  # after the last reading, for its alert

CONFIG: Final = '''
[[bridge.kafka_out]]
name = "telemetry"
filter = "tele/#"
topic = "mqtt-telemetry"
mode = "sync"

[[rule]]
name = "hot"
topics = ["mqtt-telemetry"]
payload_schema = "temp DOUBLE, seq LONG"
sql = """
SELECT clientid, window.start AS minute, avg(json.temp) AS avg_temp, count(*) AS readings,
       max(json.seq) AS seq
FROM messages
WHERE topic LIKE 'tele/%/temp' AND json.temp IS NOT NULL
GROUP BY window(ts, '1 minute'), clientid
HAVING avg(json.temp) > 30
"""
sink = "kafka"
sink_topic = "alerts"
key = "clientid"
'''


# The way back (docs/bridges.md, "Kafka to MQTT"): each alert to alerts/<its key>.
# A 20 ms fetch wait instead of the bridge's 100 ms default: alerts are sparse, so
# the wait is added to every one of them.
KAFKA_IN: Final = """
[[bridge.kafka_in]]
name = "alerts"
topics = ["alerts"]
mqtt_topic = "alerts/${key}"
fetch_wait_ms = 20
"""
MQTT_FILTER: Final = "alerts/#"


class Arrivals:
    """When each seq's alert was first seen, per place (kafka, mqtt)."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[int, float]] = {}
        self.changed = threading.Condition()

    def add(self, where: str, seq: int, at: float) -> None:
        with self.changed:
            self.seen.setdefault(where, {}).setdefault(seq, at)
            self.changed.notify_all()

    def wait_for(self, where: str, seq: int | None, timeout_s: float) -> bool:
        """Whether `seq`'s alert (None: any alert) was seen at `where` within `timeout_s`."""
        def found() -> bool:
            seen = self.seen.get(where, {})
            return bool(seen) if seq is None else seq in seen

        with self.changed:
            return self.changed.wait_for(found, timeout_s)


def tail_kafka(bootstrap: str, topic: str, arrivals: Arrivals, stop: threading.Event) -> None:
    """Read `topic` from its start (the rules job creates it) until `stop`."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-rules",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})  # fmt: skip
    try:
        while not stop.is_set():
            meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                                 for p in meta.partitions])  # fmt: skip
                break
            stop.wait(0.5)  # the job has not created the topic yet
        while not stop.is_set():
            for m in consumer.consume(100, timeout=0.1):
                value = m.value() if m.error() is None else None
                if value:
                    arrivals.add("kafka", int(json.loads(value)["seq"]), time.monotonic())
    finally:
        consumer.close()


def subscribe_mqtt(port: int, topic_filter: str, arrivals: Arrivals,
                   stop: threading.Event) -> threading.Thread:  # fmt: skip
    """An MQTT 3.1.1 subscriber of `topic_filter` (QoS 0), subscribed before this returns."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(wire.connect("bench-rules-sub") + wire.subscribe(1, topic_filter, 0))
    parser = wire.FrameParser()
    frames: list[tuple[int, bytes]] = []
    while not any(first >> 4 == 9 for first, _ in frames):  # SUBACK
        frames += parser.feed(sock.recv(65536))
    sock.settimeout(0.2)

    def read() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            now = time.monotonic()
            for first, body in parser.feed(data):
                if first >> 4 == 3:  # PUBLISH, QoS 0: topic then payload
                    payload = body[2 + int.from_bytes(body[:2], "big"):]
                    with contextlib.suppress(ValueError, KeyError):
                        arrivals.add("mqtt", int(json.loads(payload)["seq"]), now)
        sock.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


class Device:
    """One MQTT 3.1.1 client publishing readings at QoS 1, each PUBACKed before the next."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.parser = wire.FrameParser()
        self.sock.sendall(wire.connect("dev-1"))
        self._await(2)  # CONNACK

    def _await(self, kind: int) -> None:
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the node closed the connection")
            if any(first >> 4 == kind for first, _ in self.parser.feed(data)):
                return

    def publish(self, seq: int) -> float:
        """Publish reading `seq`; when it was sent (monotonic)."""
        payload = json.dumps({"temp": TEMP, "seq": seq}).encode()
        packet = wire.publish("tele/dev-1/temp", payload, qos=1,
                              packet_id=wire.packet_id_for(seq))  # fmt: skip
        sent = time.monotonic()
        self.sock.sendall(packet)
        self._await(4)  # PUBACK: the sync bridge has it in Kafka
        return sent


def start_node(config: Path, data_dir: Path) -> tuple[subprocess.Popen[str], int, str]:
    """`weir up --config config` on free ports: the process, its MQTT port, its Kafka."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    node = subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--config", str(config), "--host", "127.0.0.1",
         "--mqtt-port", "0", "--ws-port", "off", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert node.stdout is not None
    for line in node.stdout:
        found, kafka = READY.search(line), KAFKA.search(line)
        if found and kafka:
            threading.Thread(target=node.stdout.read, daemon=True).start()  # keep draining
            return node, int(found.group(1)), kafka.group(1)
    node.wait()
    raise RuntimeError("weir up did not start (or started without its Kafka)")


def start_rules(config: Path, data_dir: Path, trigger_s: float,
                log_to: str | None) -> subprocess.Popen[str]:  # fmt: skip
    """`weir streams run rules` beside the node; returns once the rule started.
    Its output goes on to `log_to` (None: nowhere)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    job = subprocess.Popen(
        [sys.executable, "-m", "streams", "run", "rules", "--config", str(config),
         "--data-dir", str(data_dir), "--trigger-s", str(trigger_s)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert job.stdout is not None
    sink: IO[str] = open(log_to, "w") if log_to else open(os.devnull, "w")  # noqa: SIM115
    for line in job.stdout:
        sink.write(line)
        if STARTED.search(line):
            break
    else:
        job.wait()
        sink.close()
        raise RuntimeError("weir streams run rules did not start the rule")

    def drain(stream: IO[str]) -> None:
        with sink:
            for line in stream:
                sink.write(line)

    threading.Thread(target=drain, args=(job.stdout,), daemon=True).start()
    return job


def stop_process(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(args: argparse.Namespace) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="weir-bench-rules-") as tmp:
        config, data_dir = Path(tmp) / "weir.toml", Path(tmp) / "data"
        config.write_text(CONFIG + KAFKA_IN)
        node, port, bootstrap = start_node(config, data_dir)
        job = None
        stop = threading.Event()
        try:
            job = start_rules(config, data_dir, args.trigger_s, args.job_log)
            arrivals = Arrivals()
            places = ["kafka", "mqtt"]
            threading.Thread(target=tail_kafka, args=(bootstrap, "alerts", arrivals, stop),
                             daemon=True).start()  # fmt: skip
            subscribe_mqtt(port, MQTT_FILTER, arrivals, stop)
            device = Device(port)
            warm = time.monotonic() + WARMUP_TIMEOUT_S
            seq = 0
            while not arrivals.wait_for(places[-1], None, args.interval_s):  # the warm-up
                if time.monotonic() > warm:
                    raise RuntimeError(f"no alert at {places[-1]} in {WARMUP_TIMEOUT_S:.0f} s")
                device.publish(seq)
                seq += 1
            time.sleep(args.interval_s)  # the warm-up's last alerts out of the way
            sent: dict[int, float] = {}
            for _ in range(args.samples):
                sent[seq] = device.publish(seq)
                seq += 1
                time.sleep(args.interval_s + random.uniform(0, args.trigger_s))
            for where in places:  # the last reading's alert, everywhere it is looked for
                arrivals.wait_for(where, seq - 1, SAMPLE_TIMEOUT_S)
            return [_line(where, sent, arrivals.seen.get(where, {})) for where in places]
        finally:
            stop.set()
            if job is not None:
                stop_process(job)
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()


def _line(where: str, sent: dict[int, float], seen: dict[int, float]) -> str:
    latencies = [seen[s] - at for s, at in sent.items() if s in seen]
    merged = sum(1 for s in sent if s not in seen and any(t > s for t in seen))
    lost = len(sent) - len(latencies) - merged
    what = "PUBLISH -> alert in Kafka" if where == "kafka" else "PUBLISH -> alert at MQTT"
    return (f"{what}: {len(latencies)} alerts, p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, max "
            f"{max(latencies, default=float('nan')) * 1000:.0f} ms; {merged} merged into a "
            f"later alert, {lost} without one")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30, help="readings measured")
    parser.add_argument("--interval-s", type=float, default=2.0,
                        help="between readings (plus a random part of the trigger)")
    parser.add_argument("--trigger-s", type=float, default=1.0, help="the rules job's trigger")
    parser.add_argument("--job-log", help="write the rules job's output to this file")
    args = parser.parse_args()
    for line in measure(args):
        print(line, flush=True)


if __name__ == "__main__":
    main()

"""A sync bridge under a SIGKILL: every PUBACKed message is in Kafka.

The node runs as a subprocess (`weir up`) on the test's Redis and Kafka
with one sync bridge. A 3.1.1 publisher sends QoS 1 messages whose payloads
are sequence numbers, up to 32 in flight; once enough are acknowledged the
node is SIGKILLed with PUBLISHes still in flight. Every sequence number
the publisher got a PUBACK for must be in the bridge's Kafka topic.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from tests.bridge.kafka import read_topic
from tests.support.childenv import weir_env
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
ACKED_BEFORE_KILL = 500
INFLIGHT = 32
MAX_SEQ = 60_000  # under paho's 65535 message ids, so none is reused
_READY = re.compile(r"ready, mqtt on [^ ]+:(\d+)")

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def start_node(config: Path, redis_url: str, bootstrap: str, prefix: str) -> tuple[Any, int]:
    env = weir_env()
    process = subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--config", str(config), "--node-id", "kill-1",
         "--redis", redis_url, "--kafka", bootstrap, "--kafka-topic-prefix", prefix,
         "--host", "127.0.0.1", "--mqtt-port", "0", "--ws-port", "off"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        found = _READY.search(line)
        if found:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep draining
            return process, int(found.group(1))
    process.kill()
    raise AssertionError(f"weir up did not start: {''.join(seen)}")


def test_sigkill_loses_no_acknowledged_message(
    tmp_path: Path, redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str
) -> None:
    topic = f"bridge-kill-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "weir.toml"
    config.write_text(f'[[bridge.kafka_out]]\nname = "k"\nfilter = "seq/#"\ntopic = "{topic}"\n'
                      'value = "${payload}"\nmode = "sync"\n')  # fmt: skip
    process, port = start_node(config, redis_url, kafka_bootstrap, kafka_topic_prefix)
    acked_mids: list[int] = []  # paho's thread appends (atomic); read after the kill
    sent: dict[int, int] = {}  # mid -> sequence number (mids stay below 65536: no reuse)
    stop = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="seq-pub")
    client.max_inflight_messages_set(INFLIGHT)
    client.max_queued_messages_set(INFLIGHT)  # publish() refuses instead of queueing far ahead
    client.on_publish = lambda c, u, mid, rc, p: acked_mids.append(mid)
    try:
        client.connect("127.0.0.1", port)
        client.loop_start()

        def publish() -> None:
            seq = 0
            while not stop.is_set() and seq < MAX_SEQ:
                info = client.publish("seq/1", b"%d" % seq, qos=1)
                if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:
                    stop.wait(0.001)  # 32 in flight: let PUBACKs come
                    continue
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    return  # the connection went with the node
                sent[info.mid] = seq
                seq += 1

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        wait_until(lambda: len(acked_mids) >= ACKED_BEFORE_KILL, "PUBACKs before the kill", 60.0)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        stop.set()
        publisher.join(timeout=10)
    finally:
        stop.set()
        client.loop_stop()
        if process.poll() is None:
            process.kill()
    acknowledged = {sent[mid] for mid in acked_mids}
    unacknowledged = set(sent.values()) - acknowledged
    in_kafka = {int(r.value) for r in read_topic(kafka_bootstrap, topic)}
    missing = sorted(acknowledged - in_kafka)
    assert not missing, f"{len(missing)} acknowledged messages not in Kafka: {missing[:20]}"
    assert len(acknowledged) >= ACKED_BEFORE_KILL
    print(f"acked {len(acknowledged)}, in flight at the kill {len(unacknowledged)}, "
          f"in Kafka {len(in_kafka)}")  # fmt: skip

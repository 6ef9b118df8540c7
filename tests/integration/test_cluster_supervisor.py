"""`weir up --nodes N`: nodes on consecutive ports under a supervisor that
restarts a node that dies, leaves a drained one down, and leaves nothing
behind when it stops or is killed. Real processes: embedded redis-server
and Kafka started by the supervisor, nodes, paho clients."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.proc import find_listener_pids
from tests.integration.conftest import Paho
from tests.support.bench_cli import bench
from tests.support.supervised import (
    REPO,
    Supervised,
    descendants,
    free_ports_in_a_row,
    wait_gone,
    wait_port_closed,
)
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

PROPAGATION_S = 15.0  # a subscription made on one node reaches the others through the log


def round_trip(pub: Paho, sub: Paho, topic: str, timeout: float = PROPAGATION_S) -> int:
    """Publish QoS 1 probes on `topic` until `sub` gets one; the probes it took."""
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n += 1
        pub.publish(topic, b"probe-%d" % n, 1)
        with contextlib.suppress(queue.Empty):
            sub.message(timeout=0.2)
            return n
    raise AssertionError(f"nothing on {topic} in {n} probes")


def drain_cli(data: Path, *node_ids: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services", "drain", "--data-dir", str(data), *node_ids],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_nodes_serve_on_consecutive_ports_and_a_killed_node_comes_back(tmp_path: Path) -> None:
    port = free_ports_in_a_row(3)
    up = Supervised(tmp_path, "--nodes", "3", "--mqtt-port", str(port), "--ws-port", "off")
    clients: list[Paho] = []
    try:
        for i in (1, 2, 3):
            up.wait_ready(i)
        for i in (1, 2, 3):
            files = up.files(i)
            assert files.log.exists() and files.pid.exists()
            assert find_listener_pids(port + i - 1) == [up.pid(i)]
            assert f"node w-{i} ready" in files.log.read_text()
        sub = Paho(port + 2, "sub-on-3", v5=True)
        pub = Paho(port, "pub-on-1", v5=True)
        clients += [sub, pub]
        assert sub.connack()[1] == 0 and pub.connack()[1] == 0
        sub.subscribe("t/#", 1)
        round_trip(pub, sub, "t/before")

        pids = [up.pid(i) for i in (1, 2, 3)]
        up.proc.send_signal(signal.SIGHUP)  # passed on to every node, not the end of all
        for i in (1, 2, 3):
            wait_until(
                lambda i=i: "SIGHUP: reading the ACL file again" in up.files(i).log.read_text(),
                f"node {i} told of the SIGHUP",
            )
        assert up.proc.poll() is None and [up.pid(i) for i in (1, 2, 3)] == pids

        old = up.pid(2)
        os.kill(old, signal.SIGKILL)
        up.wait_for(f"node w-2 (pid {old}) was killed by SIGKILL; restarting it in 1 s")
        pub.publish("t/while-down", b"x", 1)  # node 1 -> node 3 while node 2 is down
        assert sub.message().payload == b"x"
        assert find_listener_pids(port + 1) == []  # so that round trip was while it was down
        assert sub.disconnects.empty() and pub.disconnects.empty()

        up.wait_ready(2, count=2)
        new = up.pid(2)
        assert new != old and find_listener_pids(port + 1) == [new]
        assert up.files(2).log.read_text().count("node w-2 ready") == 2  # same id, same log
        back = Paho(port + 1, "sub-on-2", v5=True)
        clients.append(back)
        assert back.connack()[1] == 0
        back.subscribe("u/#", 1)
        round_trip(pub, back, "u/after")

        for c in clients:
            c.close()
        clients.clear()
        started = descendants(up.proc.pid)  # 3 nodes, redis-server, Kafka
        assert {up.pid(1), up.pid(2), up.pid(3)} <= started and len(started) >= 5, started
        assert up.stop() == 0, up.text()
        wait_gone(started)
        assert not any(up.files(i).pid.exists() for i in (1, 2, 3))
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
        up.kill()


def test_drain_cli_sends_clients_elsewhere_and_the_node_stays_down(tmp_path: Path) -> None:
    """Then a SIGKILLed supervisor leaves no process behind."""
    port = free_ports_in_a_row(2)
    up = Supervised(
        tmp_path, "--nodes", "2", "--mqtt-port", str(port), "--ws-port", "off",
        "--server-reference", f"127.0.0.1:{port + 1}",
    )  # fmt: skip
    clients: list[Paho] = []
    try:
        up.wait_ready(1)
        up.wait_ready(2)
        # The cross-node bench options, one tiny run each (the real runs are the lead's).
        [lat] = bench("latency", "--port", str(port), "--sub-port", str(port + 1),
                      "--rate", "200", "--messages", "200")  # fmt: skip
        assert lat["loss"] == 0 and lat["received"] == 200, lat
        assert lat["sub_port"] == port + 1 and lat["latency"]["p99_ms"] > 0, lat
        [idle] = bench("idle", "--port", str(port), "--ports", "2", "--connections", "20")
        assert idle["connected"] == 20, idle
        assert sorted(idle["broker_pids"]) == sorted([up.pid(1), up.pid(2)]), idle

        v5 = Paho(port, "drained-v5", v5=True)
        other = Paho(port + 1, "stays", v5=True)
        clients += [v5, other]
        assert v5.connack()[1] == 0 and other.connack()[1] == 0
        told: list[Any] = []

        def on_disconnect(c: Any, u: Any, f: Any, rc: Any, props: Any) -> None:
            told.append((rc, getattr(props, "ServerReference", None)))
            v5.disconnects.put(rc)

        v5.client.on_disconnect = on_disconnect
        v5.client._reconnect_on_failure = False
        pid = up.pid(1)
        done = drain_cli(up.data, "w-1")
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"weir drain: node w-1 (pid {pid}) told to drain\n"
        assert v5.disconnects.get(timeout=30) == 0x9C
        assert told[0] == (0x9C, f"127.0.0.1:{port + 1}")
        up.wait_for(f"node w-1 (pid {pid}) exited 0 (drained or stopped); not restarted")
        assert not up.files(1).pid.exists()
        wait_port_closed(port)
        other.subscribe("d/#", 1)
        other.publish("d/x", b"still-serving", 1)
        assert other.message().payload == b"still-serving"
        again = drain_cli(up.data, "w-1")
        assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
        assert "no pid file" in again.stderr
        assert "restarting" not in up.text()

        left = descendants(up.proc.pid)  # node 2, redis-server, Kafka
        assert up.pid(2) in left and len(left) >= 3, left
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait()
        wait_gone(left)
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
        up.kill()

"""`weir up --workers N`: N cluster nodes sharing one MQTT port (SO_REUSEPORT),
restarted by the supervisor when one dies."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.proc import find_listener_pids
from services.machine.pidfiles import NodeFiles, nodes_dir
from services.ports import free_port
from tests.integration.conftest import Paho

pytestmark = [pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 40.0
PROPAGATION_S = 15.0
WORKERS = 2
CLIENTS = 6  # enough that the kernel puts some on each worker


def test_workers_share_the_port_route_between_each_other_and_a_killed_one_restarts(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "up.log"
    args = [
        sys.executable, "-m", "services", "up", "--workers", str(WORKERS),
        "--node-id", "w", "--host", "127.0.0.1", "--mqtt-port", str(port), "--ws-port", "0",
        "--redis", redis_url, "--kafka", kafka_bootstrap,
        "--kafka-topic-prefix", kafka_topic_prefix, "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    clients: list[Paho] = []
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while log.read_bytes().count(b" ready, mqtt on ") < WORKERS:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # polling the supervisor's log for its workers' ready lines
        assert len(find_listener_pids(port)) == WORKERS
        subs = []
        for i in range(CLIENTS):
            sub = Paho(port, f"sub-{i}", v5=True)
            clients.append(sub)
            sub.connack()
            sub.subscribe("w/#", 1)
            subs.append(sub)
        pub = Paho(port, "pub", v5=True)
        clients.append(pub)
        pub.connack()
        pending = set(range(CLIENTS))
        deadline = time.monotonic() + PROPAGATION_S
        n = 0
        while pending and time.monotonic() < deadline:
            n += 1
            pub.publish("w/probe", b"%d" % n, 1)
            for i in list(pending):
                with contextlib.suppress(queue.Empty):
                    subs[i].message(timeout=0.1)
                    pending.discard(i)
        assert not pending, f"subscribers {sorted(pending)} got nothing in {n} probes"

        files = NodeFiles("w-1", nodes_dir(tmp_path / "data"))
        old = int(files.pid.read_text())
        os.kill(old, signal.SIGKILL)  # the group goes on; the supervisor starts it again
        deadline = time.monotonic() + START_TIMEOUT_S
        while log.read_bytes().count(b"node w-1 ready, mqtt on ") < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # polling the supervisor's log for the restarted worker's ready line
        assert f"node w-1 (pid {old}) was killed by SIGKILL; restarting it" in log.read_text()
        new = int(files.pid.read_text())
        other = int(NodeFiles("w-2", files.root).pid.read_text())
        assert new != old and find_listener_pids(port) == sorted([new, other])
        for c in clients:
            c.close()
        clients.clear()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert find_listener_pids(port) == []
        assert not files.pid.exists()
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
        with contextlib.suppress(ProcessLookupError):  # the group: supervisor and its workers
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_workers_refuse_the_memory_backend(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "services", "up", "--workers", "2", "--backend", "memory"]
    done = subprocess.run(args, cwd=REPO, capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert b"--workers needs shared backends" in done.stderr

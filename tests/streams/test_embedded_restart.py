"""The embedded default survives a restart of `weir up --spark` (DESIGN 6, 10).

The embedded Kafka keeps its log in memory, so the second `weir up` finds
it empty; its Redis kept its data under --data-dir, including the state
store the Spark job wrote. The node re-seeds the log from the store: the
persistent session's subscription, its queued QoS 1 messages (in Redis)
and the retained message are all there after the restart.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import redis

from services.ports import free_port
from tests.integration.conftest import Paho
from tests.support.childenv import weir_env
from tests.support.supervised import alive, descendants
from tests.support.wait import wait_until

READY_S = 120.0  # a node start plus, the second time, a re-seed of the log
STOP_S = 180.0  # the node's stop, then the Spark job's final fold (a JVM start included)


def up(data_dir: Path, port: int) -> tuple[subprocess.Popen[str], str]:
    """`weir up --spark` and the Redis URL its ready line names."""
    env = weir_env()
    args = ["--host", "127.0.0.1", "--mqtt-port", str(port), "--ws-port", "off"]
    args += ["--data-dir", str(data_dir), "--node-id", "n1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--spark", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "weir: node n1 ready" in line, line + _why_not_ready(proc)
    found = re.search(r"redis (redis://\S+),", line)
    assert found, line
    return proc, found[1]


def _why_not_ready(proc: subprocess.Popen[str]) -> str:
    """Its exit code and the end of its stderr. (An EOF on stdout came once in
    CI with the process not yet reaped, so `poll()` still said None and the
    reason was never printed.)"""
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    assert proc.stderr is not None
    return f"exit {code}: {proc.stderr.read()[-4000:]}"


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=STOP_S)
    assert proc.returncode == 0, out + err
    return out


def test_restart_of_weir_up_spark_keeps_sessions_subscriptions_queues_and_retained(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc, url = up(tmp_path, port)
    try:
        sub = Paho(port, "keeper", clean=False)
        assert sub.connack()[1] == 0
        assert sub.subscribe("fleet/#", qos=1)[0] == 1
        sub.close()
        pub = Paho(port, "pub")
        assert pub.connack()[1] == 0
        pub.publish("status/site", b"retained-v1", qos=1, retain=True)
        for i in range(5):
            pub.publish("fleet/a", f"q{i}".encode(), qos=1)  # PUBACK: in keeper's Redis queue
        pub.close()
        store = redis.Redis.from_url(url)
        wait_until(
            lambda: (
                store.hexists("{weir.state}:sessions", "keeper")
                and store.hexists("{weir.state}:subs", "keeper")
                and store.hexists("{weir.state}:retained", "status/site")
                # the node writes those itself as it appends (the embedded default);
                # the job's own mark, a folded batch, says the job runs too
                and store.hexists("{weir.state}:meta", "batch")
            ),
            "the state-store job folded the session, the subscription and the retained message",
            timeout=120.0,
        )
        store.close()
    finally:
        out = stop(proc)
    assert "state-store Spark job stopped (exit 0)" in out, out

    proc, _ = up(tmp_path, port)
    try:
        pub = Paho(port, "pub")
        assert pub.connack()[1] == 0
        pub.publish("fleet/b", b"after", qos=1)  # routes only if the subscription came back
        pub.close()
        sub = Paho(port, "keeper", clean=False)
        flags, rc = sub.connack()
        assert rc == 0 and flags.session_present
        got = [sub.message(timeout=10.0).payload.decode() for _ in range(6)]
        assert got == ["q0", "q1", "q2", "q3", "q4", "after"]
        reader = Paho(port, "reader")
        assert reader.connack()[1] == 0
        reader.subscribe("status/#", qos=1)
        retained = reader.message(timeout=10.0)
        assert (retained.topic, retained.payload, retained.retain) == (
            "status/site",
            b"retained-v1",
            True,
        )
        assert sub.before_barrier(reader, "fleet/barrier", 1) == []  # nothing else queued
        reader.close()
        sub.close()
    finally:
        stop(proc)


def _cmdline(pid: int) -> str:
    """A process's command line; "" once it is gone (a short-lived child can exit
    between the listing and the read: CI once failed on that)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_no_process_outlives_weir_up_killed_with_sigkill(tmp_path: Path) -> None:
    """redis-server, the embedded Kafka and the Spark job (its JVM too) all go."""
    proc, _ = up(tmp_path, free_port())
    wait_until(
        lambda: (
            (tmp_path / "streams" / "state.log").exists()
            and any("java" in _cmdline(p) for p in descendants(proc.pid))
        ),
        "the Spark job's JVM to start",
        timeout=120.0,
    )
    children = descendants(proc.pid)
    assert len(children) >= 4, children  # redis-server, Kafka, the job, its JVM
    proc.kill()
    proc.wait()
    wait_until(
        lambda: not any(alive(p) for p in children),
        "every process weir up started to exit",
        timeout=120.0,
    )

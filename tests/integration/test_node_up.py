"""`weir up` as a subprocess: ready line, port-in-use error, SIGTERM exits 0."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from typing import Any

from services.ports import free_port
from tests.integration.conftest import Paho
from tests.support.childenv import weir_env

START_S = 20.0


def start(*args: str) -> subprocess.Popen[str]:
    env = weir_env()
    return subprocess.Popen(
        [sys.executable, "-m", "services", "up", "--host", "127.0.0.1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_up_serves_then_sigterm_exits_0() -> None:
    mqtt_port, ws_port = free_port(), free_port()
    proc = start("--mqtt-port", str(mqtt_port), "--ws-port", str(ws_port), "--node-id", "n1")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "weir: node n1 ready" in line and f":{mqtt_port}" in line, line
        client = Paho(mqtt_port, "v5c", v5=True)
        assert client.connack()[1] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=START_S) == 0
        assert client.disconnects.get(timeout=5.0) == 0x8B  # server shutting down
        client.client.loop_stop()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_port_in_use_is_one_line_exit_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = start("--mqtt-port", str(port), "--ws-port", "0")
        _out, err = proc.communicate(timeout=START_S)
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and str(port) in err


def test_up_sigint_before_clients_exits_0() -> None:
    proc = start("--mqtt-port", "0", "--ws-port", "0")
    assert proc.stdout is not None
    assert "ready" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=START_S) == 0


def test_up_beyond_loopback_without_allow_anonymous_refuses_in_one_line() -> None:
    proc = start("--backend", "memory", "--host", "0.0.0.0", "--mqtt-port", "0", "--ws-port", "off")
    out, err = proc.communicate(timeout=START_S)
    assert proc.returncode == 2, out + err
    assert "Traceback" not in err and "ready" not in out
    assert len(err.strip().splitlines()) == 1 and "allow_anonymous" in err, err


def test_up_says_who_it_lets_in() -> None:
    """Loopback by default; another address with --allow-anonymous (then it says so)."""
    for args, expected in (
        ((), "anonymous clients allowed on 127.0.0.1 (loopback only)"),
        (("--host", "0.0.0.0", "--allow-anonymous"), "anonymous clients allowed on 0.0.0.0"),
    ):
        env = weir_env()
        proc = subprocess.Popen(
            [sys.executable, "-m", "services", "up", "--backend", "memory", "--mqtt-port", "0",
             "--ws-port", "off", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            host = "127.0.0.1" if not args else "0.0.0.0"
            assert "ready" in ready and f"mqtt on {host}:" in ready, ready
            assert expected in proc.stdout.readline()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=START_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_drain_on_sigusr1_sends_clients_elsewhere_then_exits_0() -> None:
    """SIGUSR1: stop accepting, MQTT 5 clients get DISCONNECT 0x9C "use another
    server" with the Server Reference, 3.1.1 clients are closed, then exit 0."""
    port = free_port()
    proc = start(
        "--backend", "memory", "--mqtt-port", str(port), "--ws-port", "off",
        "--server-reference", "broker-2.example:1883",
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "ready" in proc.stdout.readline()
        v5 = Paho(port, "drained-v5", v5=True)
        v3 = Paho(port, "drained-v3")
        assert v5.connack()[1] == 0 and v3.connack()[1] == 0
        told: list[Any] = []
        v5.client.on_disconnect = lambda c, u, f, rc, props: (
            told.append((rc, getattr(props, "ServerReference", None))),
            v5.disconnects.put(rc),
        )
        v5.client._reconnect_on_failure = False
        v3.client._reconnect_on_failure = False
        proc.send_signal(signal.SIGUSR1)
        assert v5.disconnects.get(timeout=START_S) == 0x9C
        assert told[0] == (0x9C, "broker-2.example:1883")
        v3.disconnects.get(timeout=START_S)  # closed (3.1.1 has no DISCONNECT from a server)
        assert proc.wait(timeout=START_S) == 0
        assert "draining" in proc.stdout.read()
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(2)
            s.connect(("127.0.0.1", port))
            raise AssertionError("the drained node still accepts connections")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_serves_metrics_on_its_http_port_and_says_where() -> None:
    import re
    import urllib.request

    proc = start("--backend", "memory", "--mqtt-port", "0", "--ws-port", "off",
                 "--http-port", "0", "--node-id", "n9")  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r", http on 127\.0\.0\.1:(\d+) ", line)
        assert found is not None, line
        url = f"http://127.0.0.1:{found.group(1)}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        assert 'weir_node_info{node="n9"' in text and "weir_connections 0.0" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=START_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_http_port_in_use_is_one_line_exit_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = start("--backend", "memory", "--mqtt-port", "0", "--ws-port", "off",
                     "--http-port", str(port))  # fmt: skip
        _out, err = proc.communicate(timeout=START_S)
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and str(port) in err, err


def test_up_http_port_off_serves_none() -> None:
    proc = start("--backend", "memory", "--mqtt-port", "0", "--ws-port", "off",
                 "--http-port", "off")  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready" in line and "http on" not in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=START_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

"""The supervisor's arguments and restart policy, and `weir drain`'s pid files,
without starting any node (the real processes: tests/integration/test_cluster_*)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from services.config import load
from services.machine import supervisor
from services.machine.drain import main as drain_main
from services.machine.pidfiles import NodeFiles, StalePidFile, live_pid, node_ids, nodes_dir
from services.node.app import main as up_main
from tests.support.wait import wait_until


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nodes", "2", "--workers", "2"], "--nodes and --workers exclude each other"),
        (["--nodes", "0"], "--nodes must be 1..64, not 0"),
        (["--workers", "65"], "--workers must be 1..64, not 65"),
        (["--nodes", "x"], "Invalid value for '--nodes': 'x' is not a valid integer"),
        (["--nodes", "3", "--mqtt-port", "65534"], "needs ports up to 65536; the last is 65535"),
        (["--nodes", "2", "--ws-port", "65535"], "from --ws-port 65535 needs ports up to 65536"),
        (["--nodes", "2", "--backend", "memory"], "--nodes needs shared backends"),
    ],
)
def test_bad_supervisor_arguments_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert up_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("weir up: ") and needle in err, err


def test_nodes_get_consecutive_ports_and_workers_share_one() -> None:
    from services.config import load

    settings = load({"listeners.mqtt_port": "1883", "listeners.ws_port": "8083"}, env={})
    assert supervisor._ports(settings, 3, shared=False) == [
        (1883, 8083),
        (1884, 8084),
        (1885, 8085),
    ]
    assert supervisor._ports(settings, 2, shared=True) == [(1883, 8083)] * 2
    off = load({"listeners.mqtt_port": "0", "listeners.ws_port": "off"}, env={})
    free = supervisor._ports(off, 2, shared=False)
    assert [ws for _, ws in free] == [None, None] and all(p > 0 for p, _ in free)


def test_a_supervised_node_reads_our_settings_with_its_own_id_ports_and_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's command line is `up --config <its settings file>` (no --nodes,
    --workers or --spark of ours); the file, read by the same loader, is our
    settings but for the node's id, ports, data dir and the shared backends,
    and the node gets no WEIR_* variable that could override it."""
    from services.config import load

    config = tmp_path / "weir.toml"
    config.write_text('[[listener]]\nname = "extra"\ntype = "tcp"\nport = 8999\n')
    ours = load({"config": str(config), "listeners.mqtt_port": "1883", "limits.queue_limit": "7",
                 "password_file": "/etc/weir/passwd"}, env={})  # fmt: skip
    files = NodeFiles("n-2", tmp_path / "nodes")
    args = supervisor.node_args(ours, files, "redis://127.0.0.1:1/0", "127.0.0.1:2", 1884, None,
                                reuse_port=True, others=["extra=9000"])  # fmt: skip
    assert args[1:5] == ["-m", "services", "up", "--config"]
    assert args[6:] == ["--node-id", "n-2", "--reuse-port"]
    assert Path(args[5]).stat().st_mode & 0o077 == 0  # it may hold a JWT secret
    node = load({"config": args[5]}, env={})
    assert (node.node_id, node.data_dir, node.listeners.mqtt_port) == ("n-2", str(files.data), 1884)
    assert node.listeners.ws_port is None and node.listeners.ports == (("extra", 9000),)
    assert (node.redis_url, node.kafka_bootstrap) == ("redis://127.0.0.1:1/0", "127.0.0.1:2")
    assert node.limits.queue_limit == 7 and node.auth == ours.auth
    monkeypatch.setenv("WEIR_MQTT_PORT", "2000")
    monkeypatch.setenv("WEIR_SPARK_MASTER", "local[1]")
    env = supervisor.child_env()
    assert "WEIR_MQTT_PORT" not in env and env["WEIR_SPARK_MASTER"] == "local[1]"


class _Exited:
    pid = 4242


@pytest.fixture
def slot(tmp_path: Path) -> supervisor.Slot:
    files = NodeFiles("w-1", tmp_path / "nodes")
    files.write_pid(_Exited.pid)
    made = supervisor.Slot("w-1", [], 1883, files, served=True)
    made.proc = _Exited()  # type: ignore[assignment]
    return made


def test_restarts_back_off_then_the_node_is_given_up_on(
    slot: supervisor.Slot, capsys: pytest.CaptureFixture[str]
) -> None:
    now, delays = 1000.0, []
    for _ in range(supervisor.RESTARTS_PER_WINDOW):
        supervisor._ended(slot, -signal.SIGKILL, now)
        assert slot.restart_at is not None and not slot.ended and not slot.files.pid.exists()
        delays.append(slot.restart_at - now)
        now += 1.0
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    supervisor._ended(slot, 1, now)
    assert slot.ended == "given up"
    err = capsys.readouterr().err
    assert "was killed by SIGKILL; restarting it in 1 s" in err
    assert "exited 1; giving up on it after 5 restarts within 60 s" in err


def test_restarts_long_ago_do_not_count(slot: supervisor.Slot) -> None:
    now = 1000.0
    for _ in range(supervisor.RESTARTS_PER_WINDOW + 1):
        supervisor._ended(slot, 1, now)
        assert not slot.ended and slot.restart_at == now + supervisor.RESTART_FIRST_S
        now += supervisor.RESTART_WINDOW_S + 1


def test_exit_0_is_not_restarted_and_exit_2_is_given_up_at_once(
    slot: supervisor.Slot, tmp_path: Path
) -> None:
    supervisor._ended(slot, 0, 1000.0)
    assert slot.ended == "exited" and slot.restart_at is None and not slot.files.pid.exists()
    other = supervisor.Slot("w-2", [], 1884, NodeFiles("w-2", tmp_path / "nodes"), served=True)
    other.proc = _Exited()  # type: ignore[assignment]
    supervisor._ended(other, 2, 1000.0)
    assert other.ended == "given up" and other.restart_at is None


def test_a_node_that_fails_its_first_start_fails_the_start(slot: supervisor.Slot) -> None:
    slot.served = False
    slot.files.log.write_text("weir: cannot listen on 127.0.0.1 (mqtt 1883): in use\n")
    with pytest.raises(supervisor._StartFailed, match="exited 1 before it was ready: weir: cannot"):
        supervisor._ended(slot, 1, 1000.0)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line names node w-1, as a supervised node's does."""
    code = "import sys, time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "up", "--node-id", "w-1"])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    wait_until(lambda: b"--node-id" in cmdline.read_bytes(), "the exec of the sleeper")
    yield proc
    proc.kill()
    proc.wait()


def test_live_pid_knows_a_node_from_a_stale_pid_file(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    files = NodeFiles("w-1", nodes_dir(tmp_path))
    with pytest.raises(StalePidFile, match="no pid file"):
        live_pid(files)
    files.write_pid(sleeper.pid)
    assert live_pid(files) == sleeper.pid and node_ids(tmp_path) == ["w-1"]
    files.write_pid(os.getpid())  # alive, but not node w-1 (a reused pid)
    with pytest.raises(StalePidFile, match=f"pid {os.getpid()} is not node w-1"):
        live_pid(files)
    files.pid.write_text("garbage\n")
    with pytest.raises(StalePidFile, match="holds no pid"):
        live_pid(files)


def test_drain_signals_the_named_nodes_and_names_stale_ones(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    root = nodes_dir(tmp_path)
    NodeFiles("w-1", root).write_pid(sleeper.pid)
    NodeFiles("w-2", root).write_pid(os.getpid())
    assert drain_main(["--data-dir", str(tmp_path)]) == 1  # all: w-1 signalled, w-2 stale
    out, err = capsys.readouterr()
    assert out == f"weir drain: node w-1 (pid {sleeper.pid}) told to drain\n"
    assert err.count("\n") == 1 and "weir drain: node w-2: stale pid file" in err
    assert sleeper.wait(timeout=10) == -signal.SIGUSR1  # python's default for SIGUSR1: exit


def test_drain_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, code, needle in (
        (["--data-dir", str(tmp_path)], 1, "no node pid files in"),
        (["--data-dir", str(tmp_path), "w-9"], 1, "node w-9: no pid file"),
        (["--bogus"], 2, "No such option '--bogus'"),
    ):
        assert drain_main(argv) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("weir drain: ") and needle in err, err


def test_each_supervised_node_gets_its_own_http_port() -> None:
    assert [supervisor.node_http_port(18083, i) for i in (1, 2, 3)] == [18083, 18084, 18085]
    assert supervisor.node_http_port(0, 2) == 0  # a free one each
    assert supervisor.node_http_port(None, 2) is None  # off stays off
    settings = replace(load({}, env={}), http_port=65_535, backend="embedded")
    assert "--http-port 65535 needs ports up to 65536" in (
        supervisor.plan_error(settings, None, 2) or ""
    )
    assert supervisor.plan_error(settings, None, 1) is None

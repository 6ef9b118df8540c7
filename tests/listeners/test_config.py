"""Listener configuration: [[listener]] tables and weir up shortcuts, bad
config as one line and exit 2, the start lines, ports under --nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from services.config import SettingsError, exposure_error, load
from services.machine import supervisor
from services.machine.pidfiles import NodeFiles
from services.node.app import main as up_main
from tests.listeners.conftest import Pki, make_pki


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "weir.toml"
    path.write_text(text)
    return str(path)


def tls(files: Pki, name: str = "secure", port: int = 8883, extra: str = "") -> str:
    return (
        f'[[listener]]\nname = "{name}"\ntype = "tls"\nport = {port}\n'
        f'certfile = "{files.certfile}"\nkeyfile = "{files.keyfile}"\n{extra}\n'
    )


def test_tables_and_shortcuts_make_the_listener_list(files: Pki, tmp_path: Path) -> None:
    path = config(
        tmp_path,
        tls(
            files,
            extra=f'cafile = "{files.cafile}"\ncert_username = "cn"\nmax_connections = 7\n'
            'allow = ["10.0.0.0/8", "127.0.0.1"]\ndeny = "10.9.0.0/16"\nhost = "0.0.0.0"\n'
            "allow_anonymous = true",
        )
        + '[[listener]]\nname = "web"\ntype = "ws"\nport = 9001\n',
    )
    cli = {
        "config": path,
        "listeners.wss_port": "8884",
        "listeners.certfile": files.certfile,
        "listeners.keyfile": files.keyfile,
        "listeners.verify": "required",
        "listeners.cafile": files.cafile,
    }
    s = load(cli, env={})
    by_name = {c.name: c for c in s.listeners.all()}
    assert list(by_name) == ["mqtt", "ws", "wss", "secure", "web"]
    assert (by_name["mqtt"].type, by_name["mqtt"].port, by_name["mqtt"].host) == (
        "tcp",
        1883,
        "127.0.0.1",
    )
    secure = by_name["secure"]
    assert secure.host == "0.0.0.0" and secure.client_certs == "optional"  # cafile, no verify
    assert [str(n) for n in secure.allow] == ["10.0.0.0/8", "127.0.0.1/32"]
    assert secure.max_connections == 7 and secure.cert_username == "cn"
    assert by_name["wss"].client_certs == "required" and by_name["web"].port == 9001
    line = secure.describe()
    assert line.startswith("listener secure: tls on 0.0.0.0:8883; TLS 1.2+") and "CN as" in line
    assert exposure_error(s) is None  # the exposed listener allows anonymous clients itself


def test_an_exposed_listener_needs_authentication(files: Pki, tmp_path: Path) -> None:
    exposed = load({"config": config(tmp_path, tls(files, extra='host = "0.0.0.0"'))}, env={})
    error = exposure_error(exposed)
    assert error is not None and "listener secure" in error and "0.0.0.0" in error
    required = tls(files, extra=f'host = "0.0.0.0"\ncafile = "{files.cafile}"\nverify = "required"')
    assert exposure_error(load({"config": config(tmp_path, required)}, env={})) is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '[[listener]]\nname = "x"\ntype = "tls"\nport = 8883\ncertfile = "/nope.pem"\n'
            'keyfile = "/nope.key"\n',
            "certfile /nope.pem is not a readable file",
        ),
        (
            '[[listener]]\nname = "x"\ntype = "tls"\nport = 8883\ncertfile = "{cert}"\n',
            "TLS needs a certfile and a keyfile",
        ),
        ('[[listener]]\nname = "x"\ntype = "tcp"\nport = 1883\n', "both use port 1883"),
        ('[[listener]]\nname = "ws"\ntype = "tcp"\nport = 2000\n', "two listeners are named 'ws'"),
        (
            '[[listener]]\nname = "x"\ntype = "tcp"\nport = 2000\ndeny = ["10.0.0.300/8"]\n',
            "'10.0.0.300/8' is not an IP address or CIDR",
        ),
        ('[[listener]]\nname = "x"\ntype = "udp"\nport = 2000\n', "type: must be one of"),
        (
            '[[listener]]\nname = "x"\ntype = "tcp"\nport = 2000\nbacklog = 5\n',
            "unknown key 'backlog'",
        ),
        ('[[listener]]\nname = "x"\ntype = "tcp"\n', "needs a port"),
        (
            '[[listener]]\nname = "x"\ntype = "tcp"\nport = 2000\ncafile = "{ca}"\n',
            "cafile needs type tls or wss",
        ),
        (
            '[[listener]]\nname = "x"\ntype = "tls"\nport = 2000\ncertfile = "{cert}"\n'
            'keyfile = "{key}"\ncert_username = "cn"\n',
            "cert_username = cn needs client",
        ),
        (
            '[[listener]]\nname = "x"\ntype = "tls"\nport = 2000\ncertfile = "{cert}"\n'
            'keyfile = "{key}"\nverify = "required"\n',
            "needs a cafile",
        ),
        (
            '[[listener]]\nname = "x"\ntype = "tls"\nport = 2000\ncertfile = "{cert}"\n'
            'keyfile = "{other_key}"\n',
            "cannot use certfile",
        ),  # a key of another certificate
        (
            '[[listener]]\nname = "x"\ntype = "tcp"\nport = 2000\nmax_connections = 0\n',
            "max_connections: Input should be greater than or equal to 1",
        ),
        ("listener = 5\n", "expected [[listener]] tables"),
        (
            '[[listener]]\nname = "open"\ntype = "tcp"\nport = 2000\nhost = "0.0.0.0"\n',
            "listener open: listening on 0.0.0.0 (not loopback)",
        ),
    ],
)
def test_bad_listener_config_is_one_line_and_exit_2(
    files: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    other = trustme.CA().issue_cert("127.0.0.1")
    other_key = tmp_path / "other.key"
    other.private_key_pem.write_to_path(str(other_key))
    text = text.format(cert=files.certfile, key=files.keyfile, ca=files.cafile, other_key=other_key)
    assert up_main(["--config", config(tmp_path, text), "--backend", "memory"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("weir up: ") and needle in err, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tls-port", "8883"], "TLS needs a certfile and a keyfile (--certfile, --keyfile)"),
        (["--tls-port", "8883", "--certfile", "/nope", "--keyfile", "/nope"], "is not a readable"),
        (["--tls-port", "1883", "--certfile", "{cert}", "--keyfile", "{key}"], "port 1883"),
        (["--wss-port", "99999"], "wss_port: Input should be less than or equal to 65535"),
        (["--listener-port", "nosuch=5"], "names no listener: nosuch"),
        (["--cert-username", "uid"], "must be one of 'none', 'cn' or 'dn'"),
    ],
)
def test_bad_shortcuts_are_one_line_and_exit_2(
    files: Pki, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    argv = [a.format(cert=files.certfile, key=files.keyfile) for a in argv]
    assert up_main([*argv, "--backend", "memory"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("weir up: ") and needle in err, err


def test_port_overrides_move_listeners() -> None:
    s = load({"listeners.ports": ["mqtt=2000", "ws=2001"]}, env={})
    assert [(c.name, c.port) for c in s.listeners.all()] == [("mqtt", 2000), ("ws", 2001)]
    with pytest.raises(SettingsError, match="expected NAME=PORT"):
        load({"listeners.ports": ["mqtt"]}, env={})


def test_nodes_get_consecutive_ports_for_every_listener(files: Pki, tmp_path: Path) -> None:
    s = load(
        {
            "config": config(
                tmp_path,
                tls(files, port=8883) + '[[listener]]\nname = "w"\ntype = "ws"\nport = 0\n',
            ),
            "listeners.mqtt_port": "1883",
        },
        env={},
    )
    nodes = supervisor._other_ports(s, 3, shared=False)
    assert [moved[0] for moved in nodes] == ["secure=8883", "secure=8884", "secure=8885"]
    free = [int(moved[1].partition("=")[2]) for moved in nodes]
    assert all(p > 0 for p in free) and len(set(free)) == 3  # port 0: a free one per node
    workers = supervisor._other_ports(s, 2, shared=True)
    assert workers[0] == workers[1] and workers[0][0] == "secure=8883"
    args = supervisor.node_args(
        s, NodeFiles("n-2", tmp_path), "redis://x:1/0", "k:1", 1884, None, False, nodes[1]
    )
    node = load({"config": args[args.index("--config") + 1]}, env={})
    ports = {c.name: c.port for c in node.listeners.all()}
    assert (ports["mqtt"], ports["secure"], ports["w"]) == (1884, 8884, free[1])
    edge = load({"config": config(tmp_path, tls(files, port=65535))}, env={})
    assert "needs ports up to 65536" in (supervisor.plan_error(edge, 2, None) or "")


def test_weir_up_says_what_each_listener_is_and_serves_tls(files: Pki, tmp_path: Path) -> None:
    from tests.integration.conftest import Paho

    path = config(
        tmp_path,
        tls(files, port=0) + '[[listener]]\nname = "ws2"\ntype = "ws"\n'
        "port = 0\nmax_connections = 3\n",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services",
            "up",
            "--backend",
            "memory",
            "--config",
            path,
            "--mqtt-port",
            "0",
            "--ws-port",
            "off",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]
        assert "ready" in lines[0], lines
        listed = [line for line in lines if line.startswith("weir: listener ")]
        assert len(listed) == 3, lines
        assert listed[0].startswith("weir: listener mqtt: tcp on 127.0.0.1:")
        assert listed[1].startswith("weir: listener secure: tls on 127.0.0.1:")
        assert "TLS 1.2+, no client certificates" in listed[1]
        assert "ws2: ws on 127.0.0.1:" in listed[2] and "at most 3 connections" in listed[2]
        tls_port = int(listed[1].split("127.0.0.1:")[1].split(";")[0])
        client = Paho(tls_port, "via-weir-up", tls=files.client())
        try:
            assert client.connack()[1] == 0
        finally:
            client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.mark.redis
@pytest.mark.kafka
def test_weir_up_nodes_gives_each_node_its_own_tls_port(files: Pki, tmp_path: Path) -> None:
    """A real `weir up --nodes 2` (embedded Redis and Kafka): node i serves TLS on
    --tls-port + i - 1, and a message crosses from one node's TLS listener to the other's."""
    from tests.integration.conftest import Paho
    from tests.integration.test_cluster_supervisor import round_trip
    from tests.support.supervised import Supervised, free_ports_in_a_row
    from tests.support.wait import wait_until

    mqtt, tls_port = free_ports_in_a_row(2), free_ports_in_a_row(2)
    up = Supervised(
        tmp_path,
        "--nodes",
        "2",
        "--mqtt-port",
        str(mqtt),
        "--ws-port",
        "off",
        "--tls-port",
        str(tls_port),
        "--certfile",
        files.certfile,
        "--keyfile",
        files.keyfile,
    )
    clients: list[Paho] = []
    try:
        for i in (1, 2):
            up.wait_ready(i)
            line = f"listener tls: tls on 127.0.0.1:{tls_port + i - 1};"
            wait_until(lambda i=i, line=line: line in up.files(i).log.read_text(), line)
        sub = Paho(tls_port + 1, "tls-sub-on-2", v5=True, tls=files.client())
        pub = Paho(tls_port, "tls-pub-on-1", v5=True, tls=files.client())
        clients += [sub, pub]
        assert sub.connack()[1] == 0 and pub.connack()[1] == 0
        sub.subscribe("t/#", 1)
        round_trip(pub, sub, "t/across")
    finally:
        for c in clients:
            c.close()
        assert up.stop() == 0, up.text()


def test_the_supervisor_names_every_listeners_ports(
    files: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = load({"config": config(tmp_path, tls(files, port=8883))}, env={})
    slots = [supervisor.Slot(f"w-{i}", [], 1882 + i, NodeFiles(f"w-{i}", tmp_path)) for i in (1, 2)]
    others = supervisor._other_ports(s, 2, shared=False)
    supervisor._say_plan(s, slots, False, "redis://r:1/0", "k:1", tmp_path, others)
    assert "2 nodes on mqtt 127.0.0.1:1883,1884, secure 8883,8884 (" in capsys.readouterr().out

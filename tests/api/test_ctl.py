"""`weir ctl` against a real `weir up --backend memory` (one node for the module):
each command, its --json answer parsed, the local key it finds on its own,
and the exit codes of every kind of error (1: the API said no or did not
answer; 2: bad arguments). Runs `weir` in-process (`services.__main__.main`)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.__main__ import main
from services.admin.ctl.client import http_url
from services.embedded import localkey
from services.mqtt.packets import Subscription
from tests.integration.rawclient import V5, Raw, v5_disconnect_code
from tests.support.api_node import KEY, SECRET, ApiNode
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    running = ApiNode(tmp_path_factory.mktemp("ctl"), "--backend", "memory")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(autouse=True)
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WEIR_API_KEY", "WEIR_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


class Ctl:
    def __init__(self, node: ApiNode, capsys: pytest.CaptureFixture[str]) -> None:
        self.data_dir = str(node.tmp / "data")
        self.capsys = capsys

    def run(self, *args: str, data_dir: bool = True) -> tuple[int, str, str]:
        self.capsys.readouterr()
        where = ["--data-dir", self.data_dir] if data_dir else []
        code = main(["ctl", *where, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self.run("--json", *args)
        assert code == 0, err
        return json.loads(out) if out.strip() else None


@pytest.fixture
def ctl(node: ApiNode, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(node, capsys)


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    opened: list[Raw] = []
    yield opened
    for r in opened:
        r.close()


def test_help_exits_0_everywhere_without_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    helps = [["ctl"], ["ctl", "clients"], ["ctl", "clients", "list"], ["ctl", "publish"],
             ["ctl", "banned", "add"]]  # fmt: skip
    for args in ([*h, "--help"] for h in helps):
        assert main(args) == 0, args
        assert "Usage: weir ctl" in capsys.readouterr().out


def test_the_local_node_and_its_local_key_are_found_in_the_data_dir(ctl: Ctl) -> None:
    found = localkey.path(ctl.data_dir)
    assert stat.S_IMODE(os.stat(found).st_mode) == 0o600
    [me] = ctl.json("cluster", "status")  # no --api-key: the local key
    mine = localkey.read(ctl.data_dir)
    assert mine is not None and mine[0] == localkey.key_name(me["node"])
    assert {k["api_key"] for k in ctl.json("apikey", "list")} >= {KEY, mine[0]}
    assert ctl.json("status")["broker_status"] == "started"
    assert me["node_status"] == "running" and me["peers"] == []
    assert ctl.json("node", "status")["node"] == me["node"]
    assert ctl.json("node", "status", me["node"])["node"] == me["node"]
    assert ctl.json("stats")[0]["node"] == me["node"]
    assert ctl.json("alarms")["meta"]["count"] == 0


def test_clients_are_listed_shown_and_kicked(ctl: Ctl, raws: list[Raw], node: ApiNode) -> None:
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    r.connect("ctl-one", username="u1", keep_alive=30)
    r.subscribe(Subscription("ctl/#", 1))
    listed = ctl.json("clients", "list", "--like", "ctl-")
    assert [c["clientid"] for c in listed["data"]] == ["ctl-one"]
    assert listed["meta"]["count"] == 1
    assert ctl.json("clients", "list", "--username", "nobody")["data"] == []
    assert ctl.json("clients", "list", "--connected", "--proto-ver", "5",
                    "--clientid", "ctl-one")["meta"]["count"] == 1  # fmt: skip
    code, out, _ = ctl.run("clients", "list", "--like", "ctl-")
    assert code == 0 and "ctl-one" in out and "u1" in out and "1 in all" in out
    shown = ctl.json("clients", "show", "ctl-one")
    assert shown["keepalive"] == 30 and shown["subscriptions"][0]["topic"] == "ctl/#"
    code, out, _ = ctl.run("clients", "show", "ctl-one")
    assert code == 0 and "ctl/# (QoS 1)" in out
    subs = ctl.json("subscriptions", "--clientid", "ctl-one")["data"]
    assert [(s["topic"], s["qos"]) for s in subs] == [("ctl/#", 1)]
    assert ctl.json("topics", "list", "--topic", "ctl/#")["data"][0]["topic"] == "ctl/#"
    assert ctl.json("topics", "show", "ctl/#")[0]["topic"] == "ctl/#"
    code, out, _ = ctl.run("clients", "kick", "ctl-one")
    assert (code, out.strip()) == (0, "kicked ctl-one")
    assert v5_disconnect_code(r.closed()) == 0x98
    wait_until(lambda: ctl.json("clients", "list", "--like", "ctl-")["meta"]["count"] == 0,
               "the kicked client's session ended")
    code, _, err = ctl.run("clients", "kick", "ctl-one")
    assert code == 1 and err.startswith("weir ctl clients kick: ") and "ctl-one" in err


def test_publish_and_retained_messages(ctl: Ctl, raws: list[Raw], node: ApiNode) -> None:
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    r.connect("ctl-sub")
    r.subscribe(Subscription("ctl/pub/#", 0))
    sent = ctl.json("publish", "ctl/pub/a", "hi", "--user-property", "k=v")
    assert sent["matched"] == 1
    code, out, _ = ctl.run("publish", "ctl/pub/kept", "a payload", "--retain", "-q", "1")
    assert code == 0 and "published to ctl/pub/kept" in out
    wait_until(lambda: any(m["topic"] == "ctl/pub/kept" for m in
                           ctl.json("retained", "list", "--topic", "ctl/pub")["data"]),
               "the retained message is listed")  # fmt: skip
    code, out, _ = ctl.run("retained", "show", "ctl/pub/kept")
    assert code == 0 and "a payload" in out
    assert ctl.json("retained", "show", "ctl/pub/kept")["qos"] == 1
    assert ctl.run("retained", "delete", "ctl/pub/kept")[0] == 0
    wait_until(lambda: ctl.run("retained", "show", "ctl/pub/kept")[0] == 1, "it is gone")
    code, _, err = ctl.run("retained", "show", "ctl/pub/kept")
    assert code == 1 and "no retained message" in err and err.count("\n") == 1


def test_bans_are_added_listed_and_lifted(ctl: Ctl) -> None:
    made = ctl.json("banned", "add", "--clientid", "ctl-bad", "--until", "1h", "--reason", "x")
    assert (made["as"], made["who"], made["reason"]) == ("clientid", "ctl-bad", "x")
    assert made["until"] is not None
    assert [b["who"] for b in ctl.json("banned", "list")["data"]] == ["ctl-bad"]
    assert ctl.run("banned", "delete", "--clientid", "ctl-bad")[0] == 0
    assert ctl.json("banned", "list")["data"] == []
    code, _, err = ctl.run("banned", "delete", "--clientid", "ctl-bad")
    assert code == 1 and "no ban of clientid ctl-bad" in err


def test_keys_are_created_used_and_revoked(ctl: Ctl, monkeypatch: pytest.MonkeyPatch) -> None:
    made = ctl.json("apikey", "create", "ctl-ci", "--desc", "for CI")
    mine = f"ctl-ci:{made['api_secret']}"
    assert ctl.json("--api-key", mine, "apikey", "list")
    monkeypatch.setenv("WEIR_API_KEY", mine)  # the variable, when no --api-key
    assert ctl.run("clients", "list")[0] == 0
    monkeypatch.delenv("WEIR_API_KEY")
    code, out, _ = ctl.run("apikey", "revoke", "ctl-ci")
    assert (code, out.strip()) == (0, "revoked API key ctl-ci")
    code, _, err = ctl.run("--api-key", mine, "clients", "list")
    assert code == 1 and "no such API key: ctl-ci" in err and "401" in err


def test_each_error_is_one_line_and_its_exit_code(ctl: Ctl, node: ApiNode,
                                                  tmp_path: Path) -> None:  # fmt: skip
    code, _, err = ctl.run("--api-key", f"{KEY}:wrong", "clients", "list")
    assert code == 1 and f"wrong secret for API key {KEY}" in err
    assert ctl.run("--api-key", f"{KEY}:{SECRET}", "clients", "list")[0] == 0
    code, _, err = ctl.run("clients", "show", "nobody-here")
    assert code == 1 and "no such client: nobody-here" in err
    url = "http://127.0.0.1:1"
    code, _, err = ctl.run("--url", url, "clients", "list")
    assert code == 1 and f"cannot reach the API at {url}" in err
    code, _, err = ctl.run("--data-dir", str(tmp_path), "clients", "list", data_dir=False)
    assert code == 1 and "no weir up is running" in err and "--url" in err
    for bad in (["--api-key", "no-colon", "clients", "list"], ["clients", "list",
                "--proto-ver", "9"], ["clients", "lst"], ["publish"],
                ["banned", "add"], ["publish", "t", "--user-property", "novalue"]):  # fmt: skip
        code, _, err = ctl.run(*bad)
        assert code == 2, bad
        assert err.count("\n") == 1 and "Traceback" not in err, err


def test_a_url_and_a_key_reach_the_node_without_its_data_dir(ctl: Ctl, node: ApiNode) -> None:
    code, out, _ = ctl.run("--url", node.url(""), "--api-key", f"{KEY}:{SECRET}", "--json",
                             "status", data_dir=False)  # fmt: skip
    assert code == 0 and json.loads(out)["app_status"] == "running"


def test_http_url_of_an_announced_address() -> None:
    assert http_url("127.0.0.1:18083") == "http://127.0.0.1:18083"
    assert http_url("0.0.0.0:1") == "http://127.0.0.1:1"
    assert http_url("::1:2") == "http://[::1]:2"
    assert http_url("https://0.0.0.0:3") == "https://127.0.0.1:3"  # --http-certfile


def test_a_clean_stop_revokes_the_local_key(tmp_path: Path) -> None:
    own = ApiNode(tmp_path, "--backend", "memory", key_file=False)
    try:
        key = localkey.read(tmp_path / "data")
        assert key is not None
        assert own.call("GET", "/api/v5/clients", auth=":".join(key))[0] == 200
    finally:
        assert own.stop() == 0
    assert localkey.read(tmp_path / "data") is None
    stored = json.loads((tmp_path / "data" / "apikeys.json").read_text())
    assert key[0] not in {row["api_key"] for row in stored}


def test_users_plugins_listeners_log_level_and_drain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own node (a password file; drained at the end, which stops it)."""
    import io

    (tmp_path / "passwd").write_text("")
    own = ApiNode(tmp_path, "--backend", "memory", "--password-file", str(tmp_path / "passwd"),
                  key_file=False)  # fmt: skip
    try:
        ctl = Ctl(own, capsys)
        monkeypatch.setattr("sys.stdin", io.StringIO("pw1\n"))
        code, out, err = ctl.run("users", "add", "ann", "--password-stdin")
        assert (code, out.strip()) == (0, "added user ann"), err
        monkeypatch.setattr("sys.stdin", io.StringIO("pw2\n"))
        code, out, _ = ctl.run("users", "add", "ann", "--password-stdin")
        assert (code, out.strip()) == (0, "changed the password of ann")
        assert (tmp_path / "passwd").read_text().startswith("ann:$argon2id$")
        assert [u["user_id"] for u in ctl.json("users", "list")["data"]] == ["ann"]
        code, _, err = ctl.run("users", "list", "--redis")  # no Redis on --backend memory
        assert code == 1 and err.count("\n") == 1
        assert ctl.run("users", "delete", "ann")[0] == 0
        assert ctl.json("users", "list")["data"] == []
        monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
        assert ctl.run("users", "add", "bob", "--password-stdin")[0] == 2  # empty password
        plugins = {p["name"]: p for p in ctl.json("plugins", "list")}
        assert "webhook" in plugins and plugins["webhook"]["running"] is False
        code, _, err = ctl.run("plugins", "stop", "no-such-plugin")
        assert code == 1 and "no-such-plugin" in err
        [mqtt] = ctl.json("listeners")
        assert mqtt["bind"].endswith(f":{own.mqtt_port}") and mqtt["running"] is True
        assert ctl.json("log-level")["level"] == "info"
        assert ctl.json("log-level", "debug")["level"] == "debug"
        assert ctl.run("log-level", "loud")[0] == 2
        code, out, _ = ctl.run("node", "drain")
        assert code == 0 and "is draining" in out
        assert own.process.wait(timeout=30) == 0  # the SIGUSR1 path: it stops
        assert any("draining" in line for line in own.log)
    finally:
        own.stop()


def test_a_client_trace_is_started_downloaded_stopped_and_deleted(
    ctl: Ctl, raws: list[Raw], node: ApiNode, tmp_path: Path
) -> None:
    made = ctl.json("trace", "start", "ctl-t", "--clientid", "ctl-traced", "--duration", "60")
    assert (made["name"], made["status"]) == ("ctl-t", "running")
    r = Raw(node.mqtt_port, V5)
    raws.append(r)
    r.connect("ctl-traced")
    r.subscribe(Subscription("tr/#", 0))

    def packets() -> set[tuple[str, str]]:
        code, out, _ = ctl.run("trace", "download", "ctl-t")
        assert code == 0
        return {(p["dir"], p["packet"]) for p in map(json.loads, out.splitlines())}

    wait_until(lambda: {("in", "CONNECT"), ("in", "SUBSCRIBE")} <= packets(), "traced")
    assert [t["name"] for t in ctl.json("trace", "list")] == ["ctl-t"]
    assert ctl.json("trace", "stop", "ctl-t")["status"] == "stopped"
    saved = tmp_path / "t.log"
    assert ctl.run("trace", "download", "ctl-t", "-o", str(saved))[0] == 0
    assert '"CONNECT"' in saved.read_text()
    assert ctl.run("trace", "delete", "ctl-t")[0] == 0
    assert ctl.json("trace", "list") == []
    assert ctl.run("trace", "start", "x")[0] == 2  # neither --clientid nor --topic
    code, _, err = ctl.run("cluster", "processes")  # a lone weir up: no supervisor
    assert code == 1 and "--nodes" in err

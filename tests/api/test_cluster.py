"""The API across a cluster: `weir up --nodes 2` (embedded Redis and Kafka,
one key file): a client on node 2 is listed, read and kicked through node 1,
and the API keys are the cluster's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.mqtt.packets import Subscription
from tests.integration.rawclient import V5, Raw, v5_disconnect_code
from tests.support.api_node import KEY, SECRET
from tests.support.supervised import Supervised, free_ports_in_a_row, wait_gone
from tests.support.wait import wait_until


class Http:
    """One node's API as `ApiNode.call` reaches it."""

    def __init__(self, port: int) -> None:
        self.http_port = port

    from tests.support.api_node import ApiNode as _Node

    url = _Node.url
    call = _Node.call


BIND_TRIES = 3  # picks of free ports (CI once lost the race for one to another worker)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Supervised, int, list[Http]]]:
    tmp: Path = tmp_path_factory.mktemp("apicluster")
    keys = tmp / "keys.txt"
    keys.write_text(f"{KEY}:{SECRET}\n")
    for attempt in range(BIND_TRIES):  # a free port can be taken by another worker first
        port = free_ports_in_a_row(2)
        where = tmp / f"try{attempt}"
        where.mkdir()
        up = Supervised(where, "--nodes", "2", "--mqtt-port", str(port), "--ws-port", "off",
                        "--http-port", "0", "--api-key-file", str(keys))  # fmt: skip
        try:
            up.wait_ready(1)
            break
        except AssertionError:
            up.stop()
            if "address already in use" not in up.text() or attempt == BIND_TRIES - 1:
                raise
    try:
        up.wait_ready(2)
        http = [re.search(r"ready, mqtt on .*?http on [^ ,]+:(\d+)", up.files(i).log.read_text())
                for i in (1, 2)]  # fmt: skip
        assert all(http), up.text()
        yield up, port, [Http(int(found.group(1))) for found in http if found]
    finally:
        pids = {up.pid(1), up.pid(2)}
        up.stop()
        wait_gone(pids)


def ok(node: Http, method: str, path: str, body: Any = None) -> Any:
    status, answer = node.call(method, path, body)
    assert 200 <= status < 300, (status, answer)
    return answer


def test_a_client_on_node_2_is_listed_read_and_kicked_through_node_1(
    cluster: tuple[Supervised, int, list[Http]],
) -> None:
    _, port, (one, _) = cluster
    r = Raw(port + 1, V5)  # node 2's MQTT port
    try:
        r.connect("far/away", keep_alive=45)
        r.subscribe(Subscription("far/#", 1))

        def listed() -> list[dict[str, Any]]:
            return ok(one, "GET", "/api/v5/clients?clientid=far%2Faway")["data"]  # type: ignore[no-any-return]

        wait_until(lambda: bool(listed()), "node 1 lists the client of node 2")
        [row] = listed()
        assert row["node"] == "w-2" and row["connected"] is True and row["proto_ver"] == 5
        assert [c["clientid"] for c in ok(one, "GET", "/api/v5/clients?node=w-2")["data"]] \
            == ["far/away"]  # fmt: skip
        detail = ok(one, "GET", "/api/v5/clients/far%2Faway")  # node 2's own answer
        assert detail["keepalive"] == 45 and detail["ip_address"] == "127.0.0.1"
        assert [s["topic"] for s in detail["subscriptions"]] == ["far/#"]
        subs = ok(one, "GET", "/api/v5/subscriptions?clientid=far%2Faway")["data"]
        assert [(s["topic"], s["node"]) for s in subs] == [("far/#", "w-2")]
        assert ok(one, "GET", "/api/v5/topics?topic=far/%23")["data"] == [
            {"topic": "far/#", "node": "w-2"}]  # fmt: skip
        nodes = {n["node"]: n for n in ok(one, "GET", "/api/v5/nodes")}
        assert set(nodes) == {"w-1", "w-2"} and nodes["w-1"]["peers"] == ["w-2"]
        assert ok(one, "GET", "/api/v5/nodes/w-2")["uptime"] > 0  # asked of node 2
        # Node 2's figures as it last wrote them (every --sys-interval), and the sum.
        figures = {f["node"]: f for f in ok(one, "GET", "/api/v5/metrics")}
        assert set(figures) == {"w-1", "w-2"} and "messages.received.1" in figures["w-2"]
        summed = ok(one, "GET", "/api/v5/metrics?aggregate=true")
        assert summed["nodes"] == ["w-1", "w-2"]
        assert summed["connections.accepted"] >= max(
            f["connections.accepted"] for f in figures.values())  # fmt: skip
        assert one.call("DELETE", "/api/v5/clients/far%2Faway")[0] == 204
        assert v5_disconnect_code(r.closed()) == 0x98
        wait_until(lambda: [c["connected"] for c in listed()] in ([], [False]),
                   "node 1 sees the kicked client gone")  # fmt: skip
        status, body = one.call("DELETE", "/api/v5/clients/far%2Faway")
        assert status == 404, body
    finally:
        r.close()


def test_the_supervisors_view(cluster: tuple[Supervised, int, list[Http]]) -> None:
    up, _, (one, _) = cluster
    rows = ok(one, "GET", "/api/v5/supervisor/nodes")
    assert [(r["node"], r["pid"], r["running"]) for r in rows] == [
        ("w-1", up.pid(1), True), ("w-2", up.pid(2), True)]  # fmt: skip
    assert rows[0]["log"] == str(up.files(1).log)


def test_keys_are_the_clusters(cluster: tuple[Supervised, int, list[Http]]) -> None:
    _, _, (one, two) = cluster
    made = ok(one, "POST", "/api/v5/api_key", {"name": "shared"})
    mine = f"shared:{made['api_secret']}"
    assert two.call("GET", "/api/v5/nodes", auth=mine)[0] == 200
    assert two.call("DELETE", "/api/v5/api_key/shared")[0] == 204
    assert one.call("GET", "/api/v5/nodes", auth=mine)[0] == 401


def test_a_publish_through_node_1_reaches_node_2(
    cluster: tuple[Supervised, int, list[Http]],
) -> None:
    _, port, (one, _) = cluster
    r = Raw(port + 1, V5)
    try:
        r.connect("listener-2")
        r.subscribe(Subscription("cross/#", 0))
        wait_until(lambda: ok(one, "GET", "/api/v5/topics?topic=cross/%23")["data"] != [],
                   "node 1 knows the route")  # fmt: skip
        assert ok(one, "POST", "/api/v5/publish", {"topic": "cross/1", "payload": "hi"})[
            "matched"] >= 1  # fmt: skip
        from services.mqtt.packets import Publish

        assert r.expect(Publish).payload == b"hi"
    finally:
        r.close()


def test_a_ban_through_node_1_disconnects_a_client_of_node_2(
    cluster: tuple[Supervised, int, list[Http]],
) -> None:
    _, port, (one, two) = cluster
    r = Raw(port + 1, V5)
    try:
        r.connect("banned-far")
        ok(one, "POST", "/api/v5/banned", {"as": "clientid", "who": "banned-far", "duration": 60})
        r.closed()  # node 2 applied the ban it heard of (the ban channel)
        assert [b["who"] for b in ok(two, "GET", "/api/v5/banned")["data"]] == ["banned-far"]
        assert two.call("DELETE", "/api/v5/banned/clientid/banned-far")[0] == 204
    finally:
        r.close()


def test_weir_ctl_on_the_data_dir_reaches_a_node_with_its_local_key(
    cluster: tuple[Supervised, int, list[Http]], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The supervisor has no HTTP port: `weir ctl` finds a node's in `nodes/<id>/`,
    with the key that node wrote there, and sees the whole cluster through it."""
    import json

    from services.__main__ import main

    up, _, _ = cluster
    monkeypatch.delenv("WEIR_API_KEY", raising=False)
    capsys.readouterr()
    assert main(["ctl", "--data-dir", str(up.data), "--json", "cluster", "status"]) == 0
    nodes = json.loads(capsys.readouterr().out)
    assert {n["node"] for n in nodes} == {"w-1", "w-2"}
    assert main(["ctl", "--data-dir", str(up.data), "--json", "apikey", "list"]) == 0
    keys = {k["api_key"] for k in json.loads(capsys.readouterr().out)}
    assert {"local-w-1", "local-w-2", KEY} <= keys
    assert main(["ctl", "--data-dir", str(up.data), "--json", "cluster", "processes"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(n["node"], n["running"]) for n in rows] == [("w-1", True), ("w-2", True)]

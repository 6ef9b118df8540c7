"""The API's base against a real `weir up --backend memory`: keys, errors,
pagination, the OpenAPI document, and the clients endpoints (one node for
the module; each test connects its own clients and closes them)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from services.mqtt.packets import Subscription
from tests.integration.rawclient import V5, V311, Raw, v5_disconnect_code
from tests.support.api_node import KEY, SECRET, ApiNode
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    running = ApiNode(tmp_path_factory.mktemp("api"), "--backend", "memory")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    opened: list[Raw] = []
    yield opened
    for r in opened:
        r.close()


def connect(node: ApiNode, raws: list[Raw], cid: str, level: int = V311, **kw: object) -> Raw:
    r = Raw(node.mqtt_port, level)
    raws.append(r)
    r.connect(cid, **kw)
    return r


def refused(node: ApiNode, reason: str) -> float:
    status, text = node.call("GET", "/metrics", auth=None)
    assert status == 200
    found = re.search(rf'^weir_api_unauthorized_total{{reason="{reason}"}} (\S+)$', text, re.M)
    assert found is not None, text
    return float(found.group(1))


def test_status_needs_no_key(node: ApiNode) -> None:
    status, text = node.call("GET", "/api/v5/status", auth=None)
    assert status == 200 and text.endswith("weir is running")
    status, body = node.call("GET", "/api/v5/status?format=json", auth=None)
    assert (status, body["broker_status"], body["app_status"]) == (200, "started", "running")


@pytest.mark.parametrize(
    ("auth", "reason"),
    [(None, "missing"), ("nobody:x", "unknown"), (f"{KEY}:wrong", "wrong_secret"),
     ("Bearer-less", "missing")],
)  # fmt: skip
def test_a_missing_or_wrong_key_is_a_counted_401(
    node: ApiNode, auth: str | None, reason: str
) -> None:
    before = refused(node, reason)
    status, body = node.call("GET", "/api/v5/clients", auth=auth)
    assert status == 401
    assert body["code"] == "BAD_API_KEY_OR_SECRET" and body["message"]
    assert refused(node, reason) == before + 1


def test_the_standard_basic_form_works_too(node: ApiNode) -> None:
    assert node.call("GET", "/api/v5/clients", auth=f"{KEY}:{SECRET}", basic64=True)[0] == 200
    assert node.call("GET", "/api/v5/clients", auth=f"{KEY}:x", basic64=True)[0] == 401


def test_keys_are_created_listed_and_revoked(node: ApiNode) -> None:
    status, made = node.call("POST", "/api/v5/api_key", {"name": "ci", "desc": "for CI"})
    assert status == 200 and made["api_key"] == "ci" and len(made["api_secret"]) > 20
    mine = f"ci:{made['api_secret']}"
    assert node.call("GET", "/api/v5/clients", auth=mine)[0] == 200
    status, keys = node.call("GET", "/api/v5/api_key", auth=mine)
    names = {k["api_key"] for k in keys}
    local = {n for n in names if n.startswith("local-")}  # the node's own, for weir ctl
    assert names - local == {KEY, "ci"} and len(local) == 1
    assert all("api_secret" not in k and "secret_hash" not in k for k in keys)
    assert node.call("POST", "/api/v5/api_key", {"name": "ci"})[0] == 409
    stored = (node.tmp / "data" / "apikeys.json").read_text()
    assert made["api_secret"] not in stored and SECRET not in stored and "argon2id" in stored
    assert node.call("DELETE", "/api/v5/api_key/ci")[0] == 204
    status, body = node.call("GET", "/api/v5/clients", auth=mine)
    assert status == 401 and "no such API key" in body["message"]
    assert node.call("DELETE", "/api/v5/api_key/ci")[0] == 404


def test_errors_are_json(node: ApiNode) -> None:
    status, body = node.call("GET", "/api/v5/nothing/here")
    assert (status, body["code"]) == (404, "NOT_FOUND")
    status, body = node.call("PUT", "/api/v5/clients")
    assert (status, body["code"]) == (405, "METHOD_NOT_ALLOWED")
    status, body = node.call("GET", "/api/v5/clients?page=0")
    assert (status, body["code"]) == (400, "BAD_REQUEST") and "page" in body["message"]
    status, body = node.call("GET", "/api/v5/clients?like_clientd=a")
    assert status == 400 and "like_clientd" in body["message"]
    status, body = node.call("GET", "/api/v5/clients?conn_state=maybe")
    assert status == 400 and "conn_state" in body["message"]
    status, body = node.call("POST", "/api/v5/api_key", "not an object")
    assert status == 400 and "JSON object" in body["message"]


def test_clients_are_paged_and_filtered(node: ApiNode, raws: list[Raw]) -> None:
    for i in range(5):
        connect(node, raws, f"pg-{i}", V5 if i % 2 else V311, username=f"user{i % 2}")
    status, page1 = node.call("GET", "/api/v5/clients?like_clientid=pg-&limit=2")
    assert status == 200
    assert [c["clientid"] for c in page1["data"]] == ["pg-0", "pg-1"]
    assert page1["meta"] == {"page": 1, "limit": 2, "count": 5, "hasnext": True}
    _, page3 = node.call("GET", "/api/v5/clients?like_clientid=pg-&limit=2&page=3")
    assert [c["clientid"] for c in page3["data"]] == ["pg-4"]
    assert page3["meta"]["hasnext"] is False

    def ids(query: str) -> list[str]:
        status, body = node.call("GET", f"/api/v5/clients?like_clientid=pg-&{query}")
        assert status == 200, body
        return [c["clientid"] for c in body["data"]]

    assert ids("proto_ver=5") == ["pg-1", "pg-3"]
    assert ids("username=user0") == ["pg-0", "pg-2", "pg-4"]
    assert ids("clientid=pg-2&clientid=pg-3") == ["pg-2", "pg-3"]
    assert ids("ip_address=127.0.0.1&conn_state=connected") == [f"pg-{i}" for i in range(5)]
    assert ids("ip_address=10.0.0.1") == []
    assert ids("node=elsewhere") == []
    assert ids("conn_state=disconnected") == []
    row = node.call("GET", "/api/v5/clients?clientid=pg-1")[1]["data"][0]
    assert row["connected"] is True and row["proto_ver"] == 5 and row["keepalive"] == 60
    assert row["ip_address"] == "127.0.0.1" and row["port"] > 0 and row["connected_at"]


def test_a_clients_detail_and_kick(node: ApiNode, raws: list[Raw]) -> None:
    r = connect(node, raws, "kick-me", V5, keep_alive=30)
    r.subscribe(Subscription("a/+", 1), Subscription("b", 0))
    status, detail = node.call("GET", "/api/v5/clients/kick-me")
    assert status == 200
    assert detail["keepalive"] == 30 and detail["subscriptions_cnt"] == 2
    assert [s["topic"] for s in detail["subscriptions"]] == ["a/+", "b"]
    assert detail["mqueue_dropped"] == 0
    assert node.call("DELETE", "/api/v5/clients/kick-me")[0] == 204
    assert v5_disconnect_code(r.closed()) == 0x98
    wait_until(lambda: node.call("GET", "/api/v5/clients?clientid=kick-me")[1]["meta"]["count"]
               == 0, "the kicked client's session ended")  # fmt: skip
    status, body = node.call("DELETE", "/api/v5/clients/kick-me")
    assert (status, body["code"]) == (404, "CLIENTID_NOT_FOUND")
    assert node.call("GET", "/api/v5/clients/nobody")[0] == 404


def test_a_kick_ends_an_offline_persistent_session(node: ApiNode, raws: list[Raw]) -> None:
    from services.mqtt.packets import Properties

    r = connect(node, raws, "keeps", V5, clean_start=False,
                properties=Properties(session_expiry_interval=3600))  # fmt: skip
    r.close()

    def state() -> list[bool]:
        answer = node.call("GET", "/api/v5/clients?clientid=keeps")[1]
        return [c["connected"] for c in answer["data"]]

    wait_until(lambda: state() == [False], "the session is offline")
    assert node.call("DELETE", "/api/v5/clients/keeps")[0] == 204
    wait_until(lambda: state() == [], "the offline session ended")


def test_the_openapi_document_declares_what_is_served(node: ApiNode) -> None:
    status, doc = node.call("GET", "/api/v5/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert {"/api/v5/clients", "/api/v5/clients/{clientid}", "/api/v5/status"} <= set(doc["paths"])
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            assert op["summary"] and {"200", "202", "204"} & set(op["responses"])
            url = re.sub(r"\{[^}]+\}", "nobody", path)
            status, body = node.call(method.upper(), url, {} if method in ("post", "put") else None)
            # Served by a route of its own: never the catch-all's "no such endpoint".
            assert status != 405 and "no such endpoint" not in json.dumps(body), (method, path)


def test_every_route_served_is_in_the_openapi_document() -> None:
    """In-process, so the server's own route table can be read."""
    from dataclasses import replace

    from services.api.openapi import document
    from tests.integration.conftest import NodeRunner, node_settings

    runner = NodeRunner(replace(node_settings(), http_port=0)).start()
    try:
        node = runner.node
        served = node.metrics_service.http.served()
        doc = document(node.api.declared, "test")
    finally:
        runner.stop()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    api = {(m, p) for m, p in served if p.startswith("/api/v5/") and "{tail" not in p}
    assert api == documented
    assert ("GET", "/metrics") in served and ("*", "/api/v5/{tail}") in served


def test_writes_are_audited_in_the_log(node: ApiNode) -> None:
    """One structured line per write, with who and how it ended; reads leave none."""

    def lines() -> list[dict[str, object]]:
        return [json.loads(x) for x in list(node.log) if '"weir.api.audit"' in x]

    before = len(lines())
    node.call("GET", "/api/v5/api_key")
    node.call("POST", "/api/v5/api_key", {"name": "audited"})
    node.call("DELETE", "/api/v5/api_key/audited")
    node.call("DELETE", "/api/v5/api_key/never-was")
    wait_until(lambda: len(lines()) >= before + 3, "the audit lines")
    new = lines()[before:]
    assert [(x["method"], x["path"], x["status"]) for x in new] == [
        ("POST", "/api/v5/api_key", 200), ("DELETE", "/api/v5/api_key/audited", 204),
        ("DELETE", "/api/v5/api_key/never-was", 404)]  # fmt: skip
    assert all(x["api_key"] == KEY and x["remote"] == "127.0.0.1" for x in new)

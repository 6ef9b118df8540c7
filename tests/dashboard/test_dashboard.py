"""The dashboard in headless Chromium against a real `weir up` (one node and
one browser for the module): log in, a wrong key, a key revoked while the
page is open, the message rate moving while a client publishes, searching
a client and kicking it, deleting a retained message, banning and lifting,
adding and deleting a user, setting the log level, every page rendering,
and pages saying "Not available" on a node whose API lacks their endpoint.
Each test saves screenshots in its tmp_path (the paths are printed; `-s`
shows them)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web

from services.api import dashboard
from services.mqtt.packets import Publish
from tests.dashboard.browser import Dashboard, missing
from tests.integration.rawclient import V5, Raw, v5_disconnect_code
from tests.support.api_node import KEY, SECRET, ApiNode
from tests.support.wait import wait_until

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

PUBLISH_INTERVAL_S = 0.005  # the publisher's pace: ~200 messages a second, a visible rate
PUBLISH_MAX = 20_000  # at most this many, whatever happens to the test


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "passwd").write_text("")  # users added through the Users page
    running = ApiNode(tmp, "--backend", "memory", "--node-id", "dash1",
                      "--password-file", str(tmp / "passwd"), "--allow-anonymous")  # fmt: skip
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser(node: ApiNode) -> Iterator[Dashboard]:
    dashboard = Dashboard(node.url("/"))
    try:
        yield dashboard
    finally:
        dashboard.quit()


@pytest.fixture
def page(browser: Dashboard) -> Iterator[Dashboard]:
    browser.script_errors()  # what an earlier test left
    yield browser
    assert browser.script_errors() == []


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    opened: list[Raw] = []
    yield opened
    for r in opened:
        r.close()


def logged_in(page: Dashboard) -> None:
    page.log_in(KEY, SECRET)
    page.wait(lambda: page.by_id("app").is_displayed(), "the dashboard after logging in")
    assert page.by_id("who").text == f"key {KEY}"


def test_a_wrong_key_shows_an_error(page: Dashboard, tmp_path: Path) -> None:
    for key, secret in [(KEY, "not-the-secret"), ("nobody", SECRET)]:
        page.log_in(key, secret)
        page.wait(lambda: "Wrong key or secret" in page.by_id("login-error").text,
                  "the login error")  # fmt: skip
        assert not page.by_id("app").is_displayed()
        assert page.driver.execute_script("return sessionStorage.length") == 0
    page.shot(tmp_path, "wrong-key")
    logged_in(page)  # the right one still works after two refusals


def test_a_revoked_key_sends_the_page_back_to_the_login(
    page: Dashboard, node: ApiNode, tmp_path: Path
) -> None:
    status, made = node.call("POST", "/api/v5/api_key", {"name": "dash-short-lived"})
    assert status == 200
    page.log_in("dash-short-lived", made["api_secret"])
    page.wait(lambda: page.by_id("app").is_displayed(), "the dashboard with the new key")
    assert node.call("DELETE", "/api/v5/api_key/dash-short-lived")[0] == 204
    # The overview's next poll (within a second) is refused: the login form, saying why.
    page.wait(lambda: "refused the key" in page.by_id("login-error").text, "the login form")
    assert not page.by_id("app").is_displayed()
    assert page.driver.execute_script("return sessionStorage.length") == 0
    page.shot(tmp_path, "revoked")


def test_the_message_rate_moves_while_a_client_publishes(
    page: Dashboard, node: ApiNode, raws: list[Raw], tmp_path: Path
) -> None:
    logged_in(page)
    page.go("#/overview")

    def rate_in() -> float | None:
        try:
            return float(page.by_id("rate-in").text)
        except ValueError:
            return None  # a dash until two polls made a rate

    page.wait(lambda: rate_in() == 0.0, "a rate of 0 before anyone publishes")
    publisher = Raw(node.mqtt_port)
    raws.append(publisher)
    publisher.connect("dash-publisher")
    stop = threading.Event()

    def publish() -> None:
        for i in range(PUBLISH_MAX):
            if stop.wait(PUBLISH_INTERVAL_S):
                return
            publisher.send(Publish("dash/load", b"%d" % i))

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        page.wait(lambda: (rate_in() or 0.0) > 10, "the in rate to rise while publishing")
        assert page.css(".charts canvas") is not None  # the charts draw
        page.shot(tmp_path, "overview-publishing")
    finally:
        stop.set()
        thread.join()
    page.wait(lambda: rate_in() == 0.0, "the in rate to fall back to 0 once it stops")


def test_search_a_client_and_kick_it(
    page: Dashboard, node: ApiNode, raws: list[Raw], tmp_path: Path
) -> None:
    victim = Raw(node.mqtt_port, V5)
    raws.append(victim)
    victim.connect("dash-kick-me")
    bystander = Raw(node.mqtt_port, V5)
    raws.append(bystander)
    bystander.connect("dash-stay")
    logged_in(page)
    page.go("#/clients")
    page.wait(lambda: len(page.rows()) >= 2, "both clients listed")
    page.css("input[name=like_clientid]").send_keys("kick")
    page.css("form.filters button[type=submit]").click()
    page.wait(lambda: [r[0] for r in page.rows()] == ["dash-kick-me"], "the search's one client")
    assert page.rows()[0][3] == "connected"
    page.shot(tmp_path, "clients-search")
    page.row_button("dash-kick-me", "Kick").click()
    assert "dash-kick-me" in page.accept_confirm()
    assert v5_disconnect_code(victim.closed()) == 0x98  # administrative action
    page.wait(lambda: page.notice() == "Kicked dash-kick-me.", "the kick's notice")
    page.shot(tmp_path, "clients-kicked")
    bystander.send(Publish("dash/still-here", b"x"))
    assert bystander.nothing()  # the other client is still connected: no DISCONNECT


def test_delete_a_retained_message(page: Dashboard, node: ApiNode, tmp_path: Path) -> None:
    for topic, payload in [("dash/ret/a", "keep me? no"), ("dash/ret/b", "keep me")]:
        status, _ = node.call("POST", "/api/v5/publish",
                              {"topic": topic, "payload": payload, "retain": True})  # fmt: skip
        assert status == 200
    logged_in(page)
    page.go("#/retained")
    page.css("input[name=topic]").send_keys("dash/ret/")
    page.css("form.filters button[type=submit]").click()
    page.wait(lambda: [r[0] for r in page.rows()] == ["dash/ret/a", "dash/ret/b"],
              "both retained messages listed")  # fmt: skip
    page.row_button("dash/ret/a", "Payload").click()
    page.wait(lambda: "keep me? no" in page.css("pre.payload").text, "the payload shown")
    page.row_button("dash/ret/a", "Delete").click()
    assert "dash/ret/a" in page.accept_confirm()
    page.wait(lambda: [r[0] for r in page.rows()] == ["dash/ret/b"], "the row gone")
    assert page.notice() == "Deleted the retained message of dash/ret/a."
    page.shot(tmp_path, "retained-deleted")
    path = "/api/v5/mqtt/retainer/message/"
    assert node.call("GET", path + quote("dash/ret/a", safe=""))[0] == 404
    assert node.call("GET", path + quote("dash/ret/b", safe=""))[0] == 200


def test_ban_a_client_id_and_lift_it(
    page: Dashboard, node: ApiNode, raws: list[Raw], tmp_path: Path
) -> None:
    logged_in(page)
    page.go("#/banned")
    page.css("input[name=who]").send_keys("dash-banned")
    page.css("input[name=duration]").send_keys("600")
    page.css("input[name=reason]").send_keys("testing the form")
    page.css("form.filters button[type=submit]").click()
    page.wait(lambda: [r[:3] for r in page.rows()] == [["clientid", "dash-banned",
              "testing the form"]], "the ban listed")  # fmt: skip
    assert page.rows()[0][4] != "never ends"  # for 600 s
    refused = Raw(node.mqtt_port, V5)
    raws.append(refused)
    assert refused.connect("dash-banned").reason_code == 0x8A  # banned
    page.shot(tmp_path, "banned")
    page.row_button("clientid", "Lift").click()
    page.wait(lambda: page.rows() == [], "the ban lifted")
    assert page.notice() == "Lifted the ban of clientid dash-banned."
    welcome = Raw(node.mqtt_port, V5)
    raws.append(welcome)
    assert welcome.connect("dash-banned").reason_code == 0


def test_add_a_user_and_delete_it(
    page: Dashboard, node: ApiNode, raws: list[Raw], tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import Select  # here: the module loads without selenium

    def connack(password: bytes) -> int:
        r = Raw(node.mqtt_port, V5)
        raws.append(r)
        code: int = r.connect(f"dash-u{len(raws)}", username="dash-user",
                              password=password).reason_code  # fmt: skip
        return code

    logged_in(page)
    page.go("#/users")
    page.wait(lambda: page.css("main .empty") is not None, "the password file's users: none")
    page.css("input[name=user_id]").send_keys("dash-user")
    page.css("input[name=password]").send_keys(" pass word ")  # taken as typed
    page.css("form.filters button[type=submit]").click()
    page.wait(lambda: [r[0] for r in page.rows()] == ["dash-user"], "the user listed")
    assert page.notice() == "Added the user dash-user."
    wait_until(lambda: connack(b" pass word ") == 0, "the user let in (the file reread)")
    assert connack(b"pass word") == 0x86  # bad user name or password
    page.shot(tmp_path, "users")
    page.row_button("dash-user", "Delete").click()
    assert "dash-user" in page.accept_confirm()
    page.wait(lambda: page.css("main .empty") is not None, "the user gone")
    wait_until(lambda: connack(b" pass word ") == 0x86, "the user refused (the file reread)")
    Select(page.css("select[name=backend]")).select_by_value("redis")
    page.wait(lambda: page.css("main .unavailable") is not None, "the Redis store's answer")
    assert page.css("main .unavailable").text.startswith("Not set up on this node: ")


def test_set_the_log_level(page: Dashboard, node: ApiNode, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import Select  # here: the module loads without selenium

    logged_in(page)
    page.go("#/nodes")
    page.wait(lambda: page.css("select[name=level]") is not None, "the log level")
    assert page.css("select[name=level]").get_attribute("value") == "info"
    Select(page.css("select[name=level]")).select_by_value("warning")
    page.css("main section button").click()
    page.wait(lambda: page.notice().startswith("Log level: warning"), "the notice")
    try:
        assert node.call("GET", "/api/v5/log/level") == (200, {"level": "warning"})
        page.shot(tmp_path, "log-level")
    finally:
        assert node.call("PUT", "/api/v5/log/level", {"level": "info"})[0] == 200


def test_every_page_renders_or_says_not_available(
    page: Dashboard, node: ApiNode, raws: list[Raw], tmp_path: Path
) -> None:
    status, doc = node.call("GET", "/api/v5/openapi.json")
    assert status == 200
    declared = {path for path, ops in doc["paths"].items() if "get" in ops}
    watcher = Raw(node.mqtt_port, V5)
    raws.append(watcher)
    watcher.connect("dash/odd <id>")  # a "/" and markup: shown as text, linked encoded
    logged_in(page)
    pages = {"overview": "/metrics", "clients": "/clients", "subscriptions": "/subscriptions",
             "topics": "/topics", "retained": "/mqtt/retainer/messages", "banned": "/banned",
             "alarms": "/alarms", "nodes": "/nodes", "listeners": "/listeners",
             "users": "/authentication/{backend}/users",
             "plugins": "/plugins"}  # fmt: skip
    for name, endpoint in pages.items():
        page.go(f"#/{name}")
        if "/api/v5" + endpoint in declared:
            page.wait(lambda: page.css("main table, main .empty") is not None, f"{name}'s data")
            assert page.css(".unavailable") is None, name
            assert page.notice() == "", (name, page.notice())
        else:
            assert "Not available" in page.css(".unavailable").text, name
        page.shot(tmp_path, name)
    page.go("#/clients/" + quote("dash/odd <id>", safe=""))
    page.wait(lambda: page.css("main h2 code") is not None, "the client's detail")
    assert page.css("main h2 code").text == "dash/odd <id>"
    assert page.notice() == ""
    page.shot(tmp_path, "client-detail")


class OlderNode:
    """A node of another version, as far as the dashboard can tell: its files,
    and an OpenAPI document declaring only the status check and itself (an
    aiohttp server on a loop of its own thread; any key is let in)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/"

    async def _start(self) -> web.AppRunner:
        async def openapi(request: web.Request) -> web.Response:
            paths = {"/api/v5/status": {"get": {}}, "/api/v5/openapi.json": {"get": {}}}
            return web.json_response({"openapi": "3.0.3", "paths": paths})

        app = web.Application()
        app.add_routes([*dashboard.routes(), web.get("/api/v5/openapi.json", openapi)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def test_a_page_whose_endpoint_the_node_lacks_says_not_available(
    page: Dashboard, tmp_path: Path
) -> None:
    older = OlderNode()
    ours = page.base_url
    page.base_url = older.url
    try:
        page.log_in("someone", "anything")
        page.wait(lambda: page.by_id("app").is_displayed(), "the dashboard")
        for name, endpoint in [("overview", "/metrics"), ("plugins", "/plugins"),
                               ("retained", "/mqtt/retainer/messages")]:  # fmt: skip
            page.go(f"#/{name}")
            assert page.css(".unavailable").text == (
                f"Not available: this node's API has no GET /api/v5{endpoint} "
                "(see its /api/v5/openapi.json)."
            )
            assert page.notice() == ""  # nothing was asked of the missing endpoint
        page.shot(tmp_path, "not-available")
    finally:
        page.base_url = ours
        older.stop()

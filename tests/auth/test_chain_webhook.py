"""The HTTP webhook backend against a real HTTP server on a loopback port
(http.server in a thread): allow / deny / ignore, what it is sent, its cache
(an allow is remembered, a new password never comes from the cache), and a
webhook that is slow, unreachable or answers nonsense (0x88, or ignore)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from services.auth.api import ALLOW, ClientInfo, Decision
from services.auth.webhook import HttpWebhook
from services.ports import free_port
from tests.auth.chainnode import ALLOWED, BAD, NOT_AUTHORIZED, UNAVAILABLE, chain_node
from tests.auth.test_chain import Fixed


class Hook:
    """The webhook's behaviour, set by the test: users -> "allow"/"deny"/"ignore"
    (the password must be "pw-<user>" to be allowed), or a raw status / body,
    or held until `release` is set."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = 200
        self.raw: bytes | None = None
        self.held = False
        self.release = threading.Event()
        self.answers: dict[str, str] = {}

    def answer(self, body: dict[str, Any]) -> str:
        user = body.get("username")
        result = self.answers.get(str(user), "ignore")
        if result == "allow" and user is not None and body.get("password") != f"pw-{user}":
            return "deny"
        return result


@contextlib.contextmanager
def webhook(keep_alive: bool = False) -> Iterator[tuple[Hook, str]]:
    """The webhook server; `keep_alive`: HTTP/1.1, connections stay open between
    requests (else each answer closes its connection, as HTTP/1.0)."""
    hook = Hook()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            body = json.loads(self.rfile.read(length))
            hook.bodies.append(body)
            if hook.held:
                hook.release.wait(10)
            data = hook.raw if hook.raw is not None else json.dumps(
                {"result": hook.answer(body)}).encode()  # fmt: skip
            self.send_response(hook.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook, f"http://127.0.0.1:{server.server_address[1]}/auth"
    finally:
        hook.release.set()
        server.shutdown()
        server.server_close()


def client(user: str | None, client_id: str = "c1") -> ClientInfo:
    return ClientInfo(client_id, user, "127.0.0.1:4711", 5)


@pytest.mark.parametrize("v5", [False, True])
def test_allow_deny_ignore_over_sockets(v5: bool) -> None:
    with webhook() as (hook, url):
        hook.answers = {"alice": "allow", "bob": "deny"}
        after = Fixed("the next backend", "carol", ALLOW)
        with chain_node([HttpWebhook(url, 2.0, 60.0), after]) as node:
            assert node.connect(v5, "alice", "pw-alice", client_id="dev-1") == ALLOWED
            assert node.connect(v5, "alice", "wrong") == BAD
            assert node.connect(v5, "bob", "pw-bob") == BAD
            assert node.connect(v5, "carol", "x") == ALLOWED, "ignore: the next backend decides"
            assert after.asked == ["carol"]
            assert node.connect(v5, None, None) == NOT_AUTHORIZED
            assert node.denied() == 3
    first = hook.bodies[0]
    assert {k: first[k] for k in ("clientid", "username", "password")} == {
        "clientid": "dev-1", "username": "alice", "password": "pw-alice"}  # fmt: skip
    assert first["peer"].startswith("127.0.0.1:")
    assert hook.bodies[-1]["username"] is None and hook.bodies[-1]["password"] is None


def test_allows_are_cached_denies_and_new_passwords_are_not() -> None:
    async def run() -> None:
        with webhook() as (hook, url):
            hook.answers = {"alice": "allow"}
            backend = HttpWebhook(url, 2.0, 60.0)
            try:
                assert await backend.check(client("alice"), b"pw-alice") == ALLOW
                assert await backend.check(client("alice"), b"pw-alice") == ALLOW
                assert len(hook.bodies) == 1, "an allow is remembered"
                denied = await backend.check(client("alice"), b"changed")
                assert denied is not None and not denied.ok
                assert len(hook.bodies) == 2, "another password is asked about"
                await backend.check(client("alice"), b"changed")
                assert len(hook.bodies) == 3, "a deny is never remembered"
                await backend.check(client("alice", "other-id"), b"pw-alice")
                assert len(hook.bodies) == 4, "the client id is part of the key"
                hook.answers = {"None": "allow"}  # the webhook lets anonymous clients in
                assert await backend.check(client(None, "c9"), None) == ALLOW
                assert await backend.check(client(None, "c9"), b"") == ALLOW
                assert len(hook.bodies) == 6, "an empty password is not a missing one"
                hook.answers = {"alice": "allow"}
                results = await asyncio.gather(
                    *(backend.check(client("alice", "burst"), b"pw-alice") for _ in range(20))
                )
                assert results == [ALLOW] * 20 and len(hook.bodies) == 7, "one request a burst"
            finally:
                await backend.aclose()

    asyncio.run(run())


def test_cache_zero_asks_every_time_and_binary_passwords_go_as_base64() -> None:
    async def run() -> None:
        with webhook() as (hook, url):
            hook.answers = {"alice": "allow"}
            backend = HttpWebhook(url, 2.0, 0.0)
            try:
                for _ in range(3):
                    assert await backend.check(client("alice"), b"pw-alice") == ALLOW
                assert len(hook.bodies) == 3
                await backend.check(client("alice"), b"\xff\x00")
                assert hook.bodies[-1]["password"] is None
                assert hook.bodies[-1]["password_base64"] == "/wA="
            finally:
                await backend.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("v5", [False, True])
def test_a_slow_webhook_times_out_to_server_unavailable(v5: bool) -> None:
    with webhook() as (hook, url):
        hook.answers = {"alice": "allow"}
        hook.held = True  # answers only once the test is done
        with chain_node([HttpWebhook(url, 0.3, 60.0)]) as node:
            assert node.connect(v5, "alice", "pw-alice") == UNAVAILABLE
            assert node.denied() == 1


def _failing(on_error: str, case: str, hook: Hook, url: str) -> Decision | None:
    if case == "unreachable":
        url = f"http://127.0.0.1:{free_port()}/auth"
    elif case == "status":
        hook.status = 500
    else:
        hook.raw = b'{"result": "maybe"}' if case == "result" else b"<html>"

    async def run() -> Decision | None:
        backend = HttpWebhook(url, 2.0, 60.0, on_error)
        try:
            return await backend.check(client("alice"), b"pw-alice")
        finally:
            await backend.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize("case", ["unreachable", "status", "result", "body"])
def test_a_failing_webhook_denies_0x88_or_is_ignored(case: str) -> None:
    with webhook() as (hook, url):
        denied = _failing("deny", case, hook, url)
        assert denied is not None and (denied.ok, denied.reason_code) == (False, 0x88)
        assert denied.by.startswith("http ")
        assert _failing("ignore", case, hook, url) is None


@pytest.mark.parametrize("v5", [False, True])
def test_an_unreachable_webhook_set_to_ignore_hands_over(v5: bool) -> None:
    url = f"http://127.0.0.1:{free_port()}/auth"
    after = Fixed("the next backend", "alice", ALLOW)
    with chain_node([HttpWebhook(url, 1.0, 60.0, "ignore"), after]) as node:
        assert node.connect(v5, "alice", "pw") == ALLOWED
        assert node.connect(v5, "bob", "pw") == BAD

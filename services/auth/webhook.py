"""An HTTP webhook that decides who connects (EMQX's HTTP authenticator).

Theory of operation. `HttpWebhook.check` POSTs one JSON object per CONNECT:
`{"clientid", "username", "password", "peer"}` (`password` as text when it
is UTF-8, else `password_base64`; absent values are null). The answer must
be status 200 with `{"result": "allow" | "deny" | "ignore"}`: allow lets
the client in, deny refuses it with 0x86 bad user name or password (3.1.1:
4), ignore hands it to the next backend of the chain.

Anything else (no answer within `timeout_s`, a refused connection, another
status, a body that is not such an object) is the webhook failing, and
`on_error` says what the client gets: "deny" (the default: refused with
0x88 server unavailable, 3.1.1: 3, so a device retries later instead of
believing its password wrong, and nobody gets in on an outage) or
"ignore" (the next backend decides, as EMQX does). Either way one log line
says why (the chain's refusal line, or a warning here when ignored).

Allow answers are remembered for `cache_s` (`services.auth.cache`), keyed by
a digest of client id, user name, password and peer address (not its port),
and concurrent identical CONNECTs share one request. A password changed at
the webhook's side is therefore still accepted from the cache for up to
`cache_s`; a new password is never answered from it. `cache_s = 0` asks
every time.

The client is httpx's AsyncClient (one per backend, keeping connections to
the webhook alive), made on first use in the node's event loop and closed
with `aclose` when the node stops.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any, Final

import httpx

from services.auth.api import ALLOW, ClientInfo, Decision
from services.auth.cache import CredentialCache, Verdict, digest

log = logging.getLogger("weir.auth")

DENIED: Final = Decision(False, 0x86)
UNAVAILABLE: Final = 0x88
ANSWERS: Final[dict[str, Verdict]] = {"allow": ALLOW, "deny": DENIED, "ignore": None}
MAX_CONNECTIONS: Final = 64  # to the webhook at once; more CONNECTs wait for one


class WebhookError(Exception):
    """The webhook gave no usable answer; the message says why in one line."""


class HttpWebhook:
    def __init__(self, url: str, timeout_s: float, cache_s: float, on_error: str = "deny") -> None:
        self.url = url
        self.name = f"http {url}"
        self.timeout_s = timeout_s
        self.on_error: Verdict = Decision(False, UNAVAILABLE) if on_error == "deny" else None
        self.cache = CredentialCache(cache_s)
        self._client: httpx.AsyncClient | None = None

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        host = client.peer.rpartition(":")[0]
        user = b"-" if client.username is None else b"u" + client.username.encode()
        secret = b"-" if password is None else b"p" + password  # None is not b""
        key = digest(client.client_id, user, secret, host)
        return await self.cache.answer(key, lambda: self._ask(client, password))

    async def _ask(self, client: ClientInfo, password: bytes | None) -> Verdict:
        try:
            return ANSWERS[await self._post(_body(client, password))]
        except WebhookError as exc:
            if self.on_error is None:
                log.warning("authentication webhook %s: %s (client %s): ignored", self.url,
                            exc, client.client_id)  # fmt: skip
                return None
            return Decision(False, UNAVAILABLE, f"{self.name}: {exc}")  # logged by the chain

    async def _post(self, body: dict[str, Any]) -> str:
        if self._client is None:
            limits = httpx.Limits(max_connections=MAX_CONNECTIONS)
            self._client = httpx.AsyncClient(timeout=self.timeout_s, limits=limits)
        try:
            async with asyncio.timeout(self.timeout_s):  # httpx's bounds each phase alone
                response = await self._client.post(self.url, json=body)
        except (httpx.TimeoutException, TimeoutError):
            raise WebhookError(f"no answer in {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise WebhookError(f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise WebhookError(f"status {response.status_code}")
        try:
            result = response.json().get("result")
        except (ValueError, AttributeError):
            raise WebhookError("the answer is not a JSON object") from None
        if result not in ANSWERS:
            raise WebhookError(f"result {result!r} is not allow, deny or ignore")
        return str(result)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _body(client: ClientInfo, password: bytes | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "clientid": client.client_id,
        "username": client.username,
        "password": None,
        "peer": client.peer,
    }
    if password is not None:
        try:
            body["password"] = password.decode("utf-8")
        except UnicodeDecodeError:
            body["password_base64"] = base64.b64encode(password).decode("ascii")
    return body

"""The `webhook` plugin: client and message events POSTed as JSON to a URL
(EMQX's webhook, the data-bridge-less part).

    [[plugin]]
    name = "webhook"
    [plugin.config]
    url = "http://127.0.0.1:8992/events"
    events = ["client.connected", "client.disconnected", "message.publish"]  # default: these
    queue = 10000        # events waiting at most; past it new ones are dropped, counted
    retries = 3          # attempts after the first, 0.1 s, 0.2 s, 0.4 s... apart
    timeout_s = 5.0      # one request's budget

Theory of operation. The hook callbacks only describe the event and put
it on a bounded queue (`put_nowait`, no await): the client that fired it
never waits for HTTP. One worker task, started by the first event (the
node's loop is running by then), posts the events one by one; a failed
post (a connection error or a non-2xx answer) is retried, then dropped
and counted. `stats()` gives sent, dropped (queue full) and failed.
The body is one JSON object: `event`, `ts` (ms), and what the hook's
arguments say: `clientid`, `username`, `peer`, `topic`, `payload`
(UTF-8, or base64 with `payload_encoding`), `qos`, `retain`, `reason`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any, Final

import httpx

from services.hooks.api import CONTINUE, HOOK_POINTS, Hooks
from services.mqtt.packets import Message

log = logging.getLogger("weir.plugins.webhook")

DEFAULT_EVENTS: Final = ("client.connected", "client.disconnected", "message.publish")
QUEUE: Final = 10_000  # events waiting: a few MB at most, minutes of a slow endpoint's backlog
RETRIES: Final = 3
TIMEOUT_S: Final = 5.0
BACKOFF_S: Final = 0.1
_KEYS: Final = {"url", "events", "queue", "retries", "timeout_s"}


def describe(point: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """The JSON body for one firing of `point` with `args`."""
    body: dict[str, Any] = {"event": point, "ts": int(time.time() * 1000)}
    for arg in args:
        if hasattr(arg, "client_id") and hasattr(arg, "peer"):  # ClientInfo (auth's)
            body.update(clientid=arg.client_id, username=arg.username, peer=arg.peer)
        elif isinstance(arg, Message):
            body.update(topic=arg.topic, qos=arg.qos, retain=arg.retain)
            try:
                body["payload"] = arg.payload.decode()
            except UnicodeDecodeError:
                body["payload"] = base64.b64encode(arg.payload).decode()
                body["payload_encoding"] = "base64"
        elif isinstance(arg, str) and "clientid" not in body:
            body["clientid"] = arg
        elif isinstance(arg, (str, int)) and not isinstance(arg, bool):
            body["reason"] = arg
    return body


class Webhook:
    def __init__(self, config: dict[str, Any]) -> None:
        unknown = set(config) - _KEYS
        if unknown:
            raise ValueError(f"unknown key {sorted(unknown)[0]!r} (webhook takes: "
                             f"{', '.join(sorted(_KEYS))})")  # fmt: skip
        url = config.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError("url: needs an http:// or https:// URL")
        self.url = url
        self.events = tuple(config.get("events", DEFAULT_EVENTS))
        bad = [e for e in self.events if e not in HOOK_POINTS]
        if bad:
            raise ValueError(f"events: {bad[0]!r} is not a hook point")
        self.retries = int(config.get("retries", RETRIES))
        self.timeout_s = float(config.get("timeout_s", TIMEOUT_S))
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(int(config.get("queue", QUEUE)))
        self.sent = self.dropped = self.failed = 0
        self._worker: asyncio.Task[None] | None = None
        self._callbacks: list[tuple[str, Any]] = []

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "dropped": self.dropped, "failed": self.failed,
                "queued": self.queue.qsize()}  # fmt: skip

    def register(self, hooks: Hooks) -> None:
        for point in self.events:
            callback = self._callback(point)
            hooks.add(point, callback, priority=-100)  # after the plugins that change things
            self._callbacks.append((point, callback))

    def unregister(self, hooks: Hooks) -> None:
        for point, callback in self._callbacks:
            hooks.remove(point, callback)
        if self._worker is not None:
            self._worker.cancel()

    def _callback(self, point: str) -> Any:
        def on_event(*args: Any) -> Any:  # a fold point's value comes last: described too
            self.enqueue(describe(point, args))
            return CONTINUE

        return on_event

    def enqueue(self, body: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(body)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("webhook %s: queue full (%d); events dropped", self.url,
                        self.queue.maxsize)  # fmt: skip
            return
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            while True:
                body = await self.queue.get()
                if await self._post(http, body):
                    self.sent += 1
                else:
                    self.failed += 1

    async def _post(self, http: httpx.AsyncClient, body: dict[str, Any]) -> bool:
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                answer = await http.post(self.url, json=body)
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            else:
                if answer.is_success:
                    return True
                why = f"HTTP {answer.status_code}"
        log.warning("webhook %s: %s event dropped after %d attempts: %s",
                    self.url, body["event"], self.retries + 1, why)  # fmt: skip
        return False

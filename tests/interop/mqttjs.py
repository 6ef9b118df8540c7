"""MQTT.js 5 under Node.js, through tests/interop/js/driver.mjs (JSON lines on stdio).

The package is pinned in tests/interop/js/package.json and package-lock.json
and installed there by scripts/setup.sh (`npm ci`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any, Protocol

from tests.interop.api import (
    REFUSED,
    Broker,
    Burst,
    ClientFailed,
    ConnectSpec,
    Msg,
    Props,
    Unsupported,
)

JS = Path(__file__).parent / "js"
DRIVER = JS / "driver.mjs"
START_S = 20.0


def missing() -> str | None:
    """Why MQTT.js cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (scripts/setup.sh installs it)"
    if not (JS / "node_modules" / "mqtt" / "package.json").exists():
        return "MQTT.js is not installed in tests/interop/js (scripts/setup.sh: npm ci)"
    return None


def version() -> str:
    meta = json.loads((JS / "node_modules" / "mqtt" / "package.json").read_text())
    return str(meta["version"])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _props(p: Props | None) -> dict[str, Any] | None:
    if p is None:
        return None
    out: dict[str, Any] = {}
    if p.user_properties:
        out["user_properties"] = [list(kv) for kv in p.user_properties]
    for name in ("message_expiry", "response_topic", "content_type", "topic_alias"):
        if getattr(p, name) is not None:
            out[name] = getattr(p, name)
    if p.correlation_data is not None:
        out["correlation_data"] = _b64(p.correlation_data)
    return out


def _msg(m: dict[str, Any]) -> Msg:
    corr = m["correlation_data"]
    return Msg(
        m["topic"],
        base64.b64decode(m["payload"]),
        m["qos"],
        m["retain"],
        Props(
            user_properties=tuple((k, v) for k, v in m["user_properties"]),
            message_expiry=m["message_expiry"],
            response_topic=m["response_topic"],
            correlation_data=None if corr is None else base64.b64decode(corr),
            content_type=m["content_type"],
        ),
    )


class Driver:
    """One node process running driver.mjs; requests answered in order."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._ids = itertools.count(1)

    @classmethod
    async def start(cls) -> Driver:
        proc = await asyncio.create_subprocess_exec(
            "node", str(DRIVER), cwd=JS,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 24,
        )  # fmt: skip
        driver = cls(proc)
        assert proc.stdout is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), START_S)
        assert b"ready" in ready, ready
        return driver

    async def call(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        rid = next(self._ids)
        self.proc.stdin.write(json.dumps({"id": rid, "op": op, "args": args}).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise ClientFailed(f"MQTT.js driver exited during {op}")
        answer = json.loads(line)
        assert answer["id"] == rid, answer
        if "error" in answer:
            raise ClientFailed(f"MQTT.js {op}: {answer['error']} (code {answer['code']})")
        result: dict[str, Any] = answer["ok"]
        return result

    async def stop(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 5.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class JsDriver(Protocol):
    """Runs one operation of driver.mjs / browser.js and returns its answer."""

    async def call(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]: ...

    async def stop(self) -> None: ...


class JsConn:
    def __init__(self, driver: JsDriver, name: str, session_present: bool) -> None:
        self.driver, self.name, self.session_present = driver, name, session_present

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        await self.driver.call("subscribe", conn=self.name, filter=topic_filter, qos=qos)

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        await self.driver.call(
            "publish", conn=self.name, topic=topic, payload=_b64(payload), qos=qos,
            retain=retain, properties=_props(props),
        )  # fmt: skip

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        got = await self.driver.call("burst", conn=self.name, topic=topic, count=count, qos=qos)
        return Burst(tuple(REFUSED if r == "151" else r for r in got["results"]))

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        got = await self.driver.call(
            "messages", timeout + 10, conn=self.name, count=count, timeout_ms=int(timeout * 1000)
        )
        return [_msg(m) for m in got["messages"]]

    async def disconnects(self) -> int:
        got = await self.driver.call("stats", conn=self.name)
        return len(got["disconnects"]) + got["closes"]

    async def drop(self) -> None:
        await self.driver.call("drop", conn=self.name)

    async def end(self) -> None:
        await self.driver.call("end", conn=self.name)


class MqttJs:
    """MQTT.js 5 in Node.js over TCP, TLS and WebSocket, 3.1.1 and 5.0."""

    name = "mqttjs"

    def __init__(self) -> None:
        self.version = version()
        self._driver: JsDriver | None = None
        self._names = itertools.count(1)

    async def _start(self) -> JsDriver:
        return await Driver.start()

    def _where(self, broker: Broker, spec: ConnectSpec) -> tuple[str, str | None]:
        """The URL to connect to and the CA file to trust (TLS)."""
        return broker.url(spec.transport), broker.cafile if spec.transport == "tls" else None

    async def connect(self, broker: Broker, spec: ConnectSpec) -> JsConn:
        url, ca = self._where(broker, spec)
        if self._driver is None:
            self._driver = await self._start()
        name = f"c{next(self._names)}"
        will = None
        if spec.will is not None:
            will = {"topic": spec.will.topic, "payload": _b64(spec.will.payload),
                    "qos": spec.will.qos}  # fmt: skip
        got = await self._driver.call(
            "connect", conn=name, url=url, client_id=spec.client_id,
            version=spec.version or 5, clean=spec.clean, session_expiry=spec.session_expiry,
            will=will, ca=ca,
        )  # fmt: skip
        return JsConn(self._driver, name, got["session_present"])

    async def close(self) -> None:
        if self._driver is not None:
            with contextlib.suppress(ProcessLookupError):
                await self._driver.stop()


__all__ = ["MqttJs", "Unsupported", "missing"]

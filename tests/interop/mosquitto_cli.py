"""mosquitto_sub / mosquitto_pub (Debian mosquitto-clients) as a matrix client.

A connection is a mosquitto_sub process (JSON output, `-F %j`) subscribed to
the filters asked for so far plus a probe topic of its own: a message
published to the probe and read back proves the subscriptions are in place
(mosquitto_sub subscribes to every -t in one SUBSCRIBE). A new filter
restarts the process with all of them. Publishing runs mosquitto_pub under
the connection's client id plus "-pub" (one id cannot hold two connections);
a burst is one `mosquitto_pub -l` reading a line per message. mosquitto_sub
stops only by itself (-C, -W) or by a signal, without DISCONNECT: `end`
kills it, which the scenarios allow (they set no will on what they end).
Neither tool has a WebSocket transport, and mosquitto_pub cannot publish to
a topic alias alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from typing import Any

from tests.interop.api import (
    Broker,
    Burst,
    ClientFailed,
    ConnectSpec,
    Msg,
    Props,
    Unsupported,
)
from tests.interop.inbox import Inbox

PROBE_S = 10.0
PROBE_EVERY_S = 0.3
RUN_S = 60.0


def missing() -> str | None:
    if shutil.which("mosquitto_sub") is None or shutil.which("mosquitto_pub") is None:
        return "mosquitto_sub / mosquitto_pub are not installed (scripts/setup.sh installs them)"
    return None


def version() -> str:
    out = subprocess.run(["mosquitto_sub", "--help"], capture_output=True, text=True, check=False)
    words = out.stdout.split()  # "mosquitto_sub version 2.0.11 running on libmosquitto ..."
    return words[words.index("version") + 1] if "version" in words else "?"


def _common(broker: Broker, spec: ConnectSpec) -> list[str]:
    if spec.transport == "ws":
        raise Unsupported("mosquitto_sub / mosquitto_pub have no WebSocket transport")
    args = ["-h", broker.host, "-V", "mqttv311" if spec.version == 4 else "mqttv5"]
    if spec.transport == "tls":
        args += ["-p", str(broker.tls_port), "--cafile", broker.cafile]
    else:
        args += ["-p", str(broker.port)]
    return args


def _msg(line: dict[str, Any]) -> Msg:
    p = line.get("properties", {})
    corr = p.get("correlation-data")
    return Msg(
        line["topic"],
        line.get("payload", "").encode(),
        line["qos"],
        bool(line["retain"]),
        Props(
            user_properties=tuple(p.get("user-properties", {}).items()),
            message_expiry=p.get("message-expiry-interval"),
            response_topic=p.get("response-topic"),
            correlation_data=None if corr is None else corr.encode(),
            content_type=p.get("content-type"),
        ),
    )


def _publish_args(props: Props | None) -> list[str]:
    if props is None:
        return []
    out: list[str] = []
    for key, value in props.user_properties:
        out += ["-D", "publish", "user-property", key, value]
    for flag, value in (
        ("message-expiry-interval", props.message_expiry),
        ("response-topic", props.response_topic),
        ("content-type", props.content_type),
        ("topic-alias", props.topic_alias),
    ):
        if value is not None:
            out += ["-D", "publish", flag, str(value)]
    if props.correlation_data is not None:
        out += ["-D", "publish", "correlation-data", props.correlation_data.decode()]
    return out


class MosquittoConn:
    def __init__(self, broker: Broker, spec: ConnectSpec) -> None:
        self.broker, self.spec = broker, spec
        self.session_present: bool | None = None  # mosquitto_sub does not print the flag
        self.inbox = Inbox()
        self.filters: list[tuple[str, int]] = []
        self.probe = f"{spec.client_id}/probe"
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._probed = asyncio.Event()
        self._ended = False
        self.died = 0

    async def start(self) -> MosquittoConn:
        spec = self.spec
        args = ["mosquitto_sub", *_common(self.broker, spec), "-i", spec.client_id, "-F", "%j"]
        qos = max([0, *(q for _, q in self.filters)])  # one QoS for every -t: the highest
        args += ["-k", "30", "-q", str(qos), "-t", self.probe]
        for topic_filter, _ in self.filters:
            args += ["-t", topic_filter]
        if not spec.clean:
            args += ["-c"] + (["-x", str(spec.session_expiry)] if spec.version != 4 else [])
        if spec.will is not None:
            args += ["--will-topic", spec.will.topic, "--will-payload", spec.will.payload.decode()]
            args += ["--will-qos", str(spec.will.qos)]
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self._probed.clear()
        self._reader = asyncio.create_task(self._read(self.proc))
        await self._probe()
        return self

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = json.loads(raw)
            if line["topic"] == self.probe:
                self._probed.set()
            else:
                self.inbox.put(_msg(line))
        if not self._ended and proc is self.proc:
            self.died += 1

    async def _probe(self) -> None:
        """Until a probe comes back: the process has no way to say it has subscribed,
        and a probe published before its SUBSCRIBE is handled is lost, so it is sent
        again each PROBE_EVERY_S (bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PROBE_S
        while loop.time() < deadline:
            await self._run_pub(["-t", self.probe, "-m", "probe", "-q", "0"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._probed.wait(), PROBE_EVERY_S)
                return
        assert self.proc is not None and self.proc.stderr is not None
        self.proc.kill()
        err = (await self.proc.stderr.read()).decode().strip()
        raise ClientFailed(f"mosquitto_sub did not come up: {err}")

    async def _run_pub(self, args: list[str], stdin: bytes | None = None) -> None:
        cmd = ["mosquitto_pub", *_common(self.broker, self.spec)]
        cmd += ["-i", f"{self.spec.client_id}-pub", *args]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(stdin), RUN_S)
        if proc.returncode:
            raise ClientFailed(f"mosquitto_pub exited {proc.returncode}: {out.decode().strip()}")

    async def _stop(self) -> None:
        self._ended = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()  # SIGKILL: mosquitto_sub has no clean stop from outside
            await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        self.filters.append((topic_filter, qos))
        await self._stop()
        self._ended = False
        await self.start()

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool = False, props: Props | None = None
    ) -> None:
        if not topic:
            raise Unsupported("mosquitto_pub cannot publish to a topic alias alone")
        body = ["-n"] if not payload else ["-m", payload.decode()]
        await self._run_pub(
            ["-t", topic, *body, "-q", str(qos), *(["-r"] if retain else []), *_publish_args(props)]
        )

    async def burst(self, topic: str, count: int, qos: int) -> Burst:
        lines = b"".join(b"%d\n" % i for i in range(count))
        try:
            await self._run_pub(["-t", topic, "-l", "-q", str(qos)], stdin=lines)
        except ClientFailed as exc:
            return Burst((str(exc),) * count)
        return Burst((None,) * count)

    async def messages(self, count: int, timeout: float) -> list[Msg]:
        return await self.inbox.take(count, timeout)

    async def disconnects(self) -> int:
        return self.died

    async def drop(self) -> None:
        await self._stop()

    async def end(self) -> None:
        await self._stop()


class MosquittoCli:
    """mosquitto_sub / mosquitto_pub over TCP and TLS, 3.1.1 and 5.0."""

    name = "mosquitto"

    def __init__(self) -> None:
        self.version = version()
        self._conns: list[MosquittoConn] = []

    async def connect(self, broker: Broker, spec: ConnectSpec) -> MosquittoConn:
        conn = MosquittoConn(broker, spec)
        self._conns.append(conn)
        return await conn.start()

    async def close(self) -> None:
        for conn in self._conns:
            await conn._stop()


__all__ = ["MosquittoCli", "missing"]

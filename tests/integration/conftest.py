"""A real node on free loopback ports, run in its own thread and event loop.

Blocking clients (paho) and asyncio clients (gmqtt, in the test's loop) can
both talk to it; tests wait on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from services.config import Listeners, Settings, load

if TYPE_CHECKING:
    from services.broker.seams import Seams
    from tests.integration.rawclient import Raw

START_TIMEOUT_S = 10.0
# A bound, not a measure (no test waits for a CONNACK that must not come): behind
# three argon2id verifies, on two xdist workers under load, one took over 5 s.
CONNACK_S = 20.0
_SENTINELS = itertools.count(1)  # barrier payloads, unique in a test run


class NodeRunner:
    def __init__(self, settings: Settings, seams: Seams | None = None) -> None:
        self.settings = settings
        self.seams = seams  # None: the composition root's (allow all)
        self.node: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="weir-node", daemon=True)

    @property
    def mqtt_port(self) -> int:
        port: int = self.node.mqtt_port
        return port

    @property
    def ws_port(self) -> int:
        port: int = self.node.ws_port
        return port

    def start(self) -> NodeRunner:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError("node did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        from services.node.app import build_services
        from services.node.node import Node

        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        services = build_services(self.settings)
        if self.seams is not None:
            services = replace(services, seams=self.seams)
        self.node = Node(self.settings, services)
        try:
            await self.node.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.node.stop()

    def call(self, fn: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Run `fn` on the node's loop and return its result."""
        assert self.loop is not None
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            box.append(fn())
            done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(timeout)
        return box[0]

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=15)
        assert not self._thread.is_alive(), "node did not stop"


def node_settings(**limits: Any) -> Settings:
    base = load({}, env={})
    return replace(
        base,
        node_id="test-node",
        listeners=Listeners(host="127.0.0.1", mqtt_port=0, ws_port=0),
        http_port=None,  # no HTTP port: nodes of parallel runs never meet on 18083
        limits=replace(base.limits, shutdown_grace_s=2.0, **limits),
    )


@pytest.fixture
def node() -> Iterator[NodeRunner]:
    runner = NodeRunner(node_settings()).start()
    try:
        yield runner
    finally:
        runner.stop()


class Paho:
    """A paho-mqtt client with its callbacks turned into queues and events."""

    def __init__(
        self,
        port: int,
        client_id: str,
        v5: bool = False,
        clean: bool = True,
        transport: str = "tcp",
        will: tuple[str, bytes, int] | None = None,
        session_expiry: int | None = None,
        keepalive: int = 30,
        will_delay: int | None = None,
        username: str | None = None,
        password: str | None = None,
        host: str = "127.0.0.1",
        tls: Any = None,  # an ssl.SSLContext: connect over TLS with it
    ) -> None:
        import queue

        import paho.mqtt.client as mqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.messages: queue.Queue[Any] = queue.Queue()
        self.connacks: queue.Queue[Any] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.subacks: queue.Queue[Any] = queue.Queue()
        self.published: queue.Queue[int] = queue.Queue()
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        kwargs: dict[str, Any] = {}
        if not v5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            transport=transport,  # type: ignore[arg-type]
            **kwargs,
        )
        if will is not None:
            will_props = None
            if will_delay is not None:
                will_props = Properties(PacketTypes.WILLMESSAGE)
                will_props.WillDelayInterval = will_delay
            self.client.will_set(will[0], will[1], will[2], properties=will_props)
        if username is not None:
            self.client.username_pw_set(username, password)
        if tls is not None:
            self.client.tls_set_context(tls)
        self.client.on_connect = lambda c, u, f, rc, p: self.connacks.put((f, rc))
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_disconnect = lambda c, u, f, rc, p: self.disconnects.put(rc)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subacks.put(rcs)
        self.client.on_publish = lambda c, u, mid, rc, p: self.published.put(mid)
        connect_props = None
        clean_start: Any = mqtt.MQTT_CLEAN_START_FIRST_ONLY
        if v5:
            connect_props = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                connect_props.SessionExpiryInterval = session_expiry
            clean_start = clean
        self.client.connect(
            host,
            port,
            keepalive=keepalive,
            clean_start=clean_start,
            properties=connect_props,
        )
        self.client.loop_start()

    def connack(self, timeout: float = CONNACK_S) -> Any:
        return self.connacks.get(timeout=timeout)

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> Any:
        if options:
            from paho.mqtt.subscribeoptions import SubscribeOptions

            self.client.subscribe(topic, options=SubscribeOptions(qos=qos, **options))
        else:
            self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=5.0)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos, retain)
        if qos:
            info.wait_for_publish(timeout=5.0)
            assert info.is_published()

    def message(self, timeout: float = 5.0) -> Any:
        return self.messages.get(timeout=timeout)

    def before_barrier(self, sender: Paho, topic: str, qos: int = 0) -> list[Any]:
        """The messages this client gets before a barrier: `sender` publishes a sentinel
        on `topic`, which this client is subscribed to, and everything that comes ahead
        of the sentinel is returned (the sentinel is not). An absence check without a
        timed wait: `assert c.before_barrier(pub, "t") == []`.

        It proves what it should only if a message that must not come would have been
        on its way to this client before the sentinel: the sentinel goes after it on the
        same connection (or after whatever caused it), and at a QoS that does not let it
        overtake: a QoS 0 copy is written at once, a QoS 1/2 copy goes through the
        queue, and paho hands a QoS 2 message over only at PUBREL, so where a QoS 2
        message could come, the sentinel is QoS 2 too."""
        sentinel = b"barrier-%d" % next(_SENTINELS)
        sender.publish(topic, sentinel, qos)
        before: list[Any] = []
        while (m := self.message()).payload != sentinel:
            before.append(m)
            assert len(before) < 1000
        assert m.topic == topic
        return before

    def no_message(self, within: float = 0.3) -> bool:
        """True if no message arrives within `within` seconds (a timed absence check,
        for where `before_barrier` cannot be used)."""
        import queue

        try:
            self.messages.get(timeout=within)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT (so the will fires)."""
        sock = self.client.socket()
        if sock is not None:
            import socket as socket_mod

            sock.shutdown(socket_mod.SHUT_RDWR)
        self.client.loop_stop()


@pytest.fixture
def clients() -> Iterator[list[Paho]]:
    made: list[Paho] = []
    yield made
    for c in made:
        with contextlib.suppress(Exception):
            c.close()


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    """Raw-socket clients a test opens; all closed after it."""
    made: list[Raw] = []
    yield made
    for r in made:
        r.close()

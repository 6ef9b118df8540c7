"""A running node: the broker plus its listeners (TCP, TLS, WebSocket, WSS;
`services.listener.listeners`).

Start (DESIGN 6): read the ban table (`Seams.start`), replay the event
log to the end of every partition into the broker's state (`LogState`),
warm the event log (`EventLog.warm`: the first CONNACK need not wait),
freeze what the replay allocated out of the garbage collector's way
(`gc.freeze`), then open the listeners, then tail the log, then start
the Kafka -> MQTT bridges (`services.bridge.ingress`: their messages need
every route). So the node is ready only once it knows every subscription,
session and retained message the log holds. A freeze keeps whatever is in the heap then, garbage
too, so the start first collects what was already garbage (in a process
that runs node after node, as the tests do: earlier nodes and clients,
with their sockets).

Shutdown order (STYLE 11): stop the Kafka -> MQTT bridges (what they have
in flight is routed and committed), stop accepting, tell every client
(5.0 gets DISCONNECT 0x8B), flush and close, wait a bounded grace for sockets and
broker tasks, then abort whatever is left; then stop the seams (the ban
table's tasks, the authenticator's connections) and the cluster, and give
what the start froze back to the collector (`gc.unfreeze`). Everything a
node started is stopped and awaited by then; what the composition root
opened (Redis, Kafka) it closes after (`services.node.app.open_backends`).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from services.api.keys import read_key_file
from services.api.service import Api, ApiConfig
from services.bridge.api import BridgeStats
from services.broker.broker import Broker
from services.broker.ports import Flow
from services.broker.seams import Seams
from services.broker.timers import TimerWheel
from services.cluster.router import ClusterRouter
from services.config import Settings
from services.config.auth import AuthKind
from services.config.settings import http_ssl_context
from services.event.api import EventLog
from services.listener.connection import Connection
from services.listener.listeners import Listener
from services.listener.websocket import WebSocketProtocol
from services.metrics.cluster import ClusterFigures, FigureStore, MemoryFigures
from services.metrics.registry import BridgeFigures, Metrics
from services.metrics.service import MetricsService
from services.metrics.systopics import ClientEvents
from services.metrics.trace import Tracer
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import ReasonCode
from services.node import bootstrap
from services.node import dump as viewdump
from services.queue.api import QueueStore
from services.retain.api import RetainStore
from services.session.api import SessionStore, WillStore
from services.session.memory import MemoryWillStore
from services.state.store import StateStore

if TYPE_CHECKING:
    from services.bridge.ingress import KafkaIngresses


@dataclass(frozen=True, slots=True)
class Services:
    """The backends a node runs on; the composition root picks them."""

    sessions: SessionStore
    queue: QueueStore
    retain: RetainStore
    events: EventLog
    cluster: ClusterRouter | None = None  # None: a node on its own (memory backends)
    seams: Seams = field(default_factory=Seams)  # auth, hooks, metrics: allow-all, no-op
    state: StateStore | None = None  # the Spark job's state store: start from it (DESIGN 6)
    endpoints: tuple[str, str] | None = None  # (redis URL, kafka bootstrap) when not memory
    wills: WillStore = field(default_factory=MemoryWillStore)  # Redis beside a Redis store
    figures: FigureStore | None = None  # every node's figures (Redis); None: this node only


def channel_config(settings: Settings, seams: Seams) -> ChannelConfig:
    """The channels' limits, whether they ask the node to authenticate, and where
    they count what they route: the node's metrics."""
    limits = settings.limits
    return ChannelConfig(
        received=seams.metrics.received,
        receive_maximum=limits.receive_maximum,
        strict_receive_maximum=limits.strict_receive_maximum,
        max_awaiting_rel=limits.max_awaiting_rel,
        max_packet_size=limits.max_packet_size,
        max_keep_alive=limits.max_keep_alive_s,
        max_subscriptions=limits.max_subscriptions,
        max_inflight=limits.max_inflight,
        authenticate=seams.authenticates,
    )


def broker_for(settings: Settings, services: Services, loop: asyncio.AbstractEventLoop,
               wheel: TimerWheel, tracer: Tracer | None = None) -> Broker:  # fmt: skip
    """The broker `settings` ask for, on `services` (a node's; bench.pathcost's)."""
    return Broker(
        node_id=settings.node_id,
        channel_config=channel_config(settings, services.seams),
        flow=flow(settings),
        max_connections=settings.limits.max_connections,
        queue_limit=settings.limits.queue_limit,
        sessions=services.sessions,
        queue=services.queue,
        retain=services.retain,
        loop=loop,
        wheel=wheel,
        shared_strategy=settings.shared_subscription_strategy,
        shared_local=settings.shared_local,
        events=services.events,
        cluster=services.cluster,
        seams=services.seams,
        wills=services.wills,
        tracer=tracer,
    )


def flow(settings: Settings) -> Flow:
    limits = settings.limits
    return Flow(
        max_packet_size=limits.max_packet_size,
        outbound_high_water=limits.outbound_high_water,
        outbound_low_water=limits.outbound_low_water,
        subscriber_queue_bytes=limits.subscriber_queue_bytes,
    )


def open_listeners(settings: Settings, broker: Broker, metrics: Metrics) -> list[Listener]:
    """One `Listener` per configured listener (not bound yet), each with its protocol."""

    def connection(listener: Listener) -> asyncio.Protocol:
        return Connection(broker, listener)

    def websocket(listener: Listener) -> asyncio.Protocol:
        return WebSocketProtocol(broker, listener)

    return [
        Listener(config, websocket if config.websocket else connection, metrics)
        for config in settings.listeners.all()
    ]


def api_config(settings: Settings, services: Services, version: str) -> ApiConfig:
    password_files = [a.path for a in settings.auth if a.backend == AuthKind.PASSWORD_FILE]
    return ApiConfig(
        node_id=settings.node_id,
        version=version,
        data_dir=settings.data_dir,
        redis_url=services.endpoints[0] if services.endpoints is not None else None,
        key_pairs=tuple(read_key_file(settings.api_key_file) if settings.api_key_file else ()),
        password_file=password_files[0] if password_files else None,
        plugin_configs={p.name: p.config for p in settings.plugin},
    )


def weir_version() -> str:
    try:
        return importlib.metadata.version("weir")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree not installed
        return "unknown"


class Node:
    def __init__(self, settings: Settings, services: Services, reuse_port: bool = False) -> None:
        self.settings = settings
        self.services = services
        self.reuse_port = reuse_port  # workers of `weir up --workers N` share the MQTT port
        self.broker: Broker | None = None
        self.wheel: TimerWheel | None = None
        self._servers: list[asyncio.Server] = []
        self.listeners: list[Listener] = []
        self.mqtt_port: int | None = None
        self.ws_port: int | None = None
        self.replayed = 0  # events read at start: state store entries plus log records
        self.started_from = ""  # bootstrap.Started.source
        self._viewdump: asyncio.Task[None] | None = None  # answers the drift check
        self.version = weir_version()
        self.metrics_service: MetricsService | None = None  # /metrics, $SYS, alarms
        self.api: Api | None = None  # the management API, on the HTTP port
        self.http_port: int | None = None
        # per-client and per-topic packet traces, files under <data-dir>/trace; the
        # management API starts, lists, stops, deletes and reads them through it
        self.tracer = Tracer(Path(settings.data_dir) / "trace", settings.node_id)
        self.client_events: ClientEvents | None = None  # --sys-client-events
        self.cluster_figures: ClusterFigures | None = None  # the sum over live nodes
        self.ingress: KafkaIngresses | None = None  # [[bridge.kafka_in]], once the node is up

    async def start(self) -> None:
        """Bind the listeners; raises OSError (e.g. port in use) with nothing left open."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        self.wheel = TimerWheel(loop)
        broker = broker_for(settings, self.services, loop, self.wheel, self.tracer)
        self.broker = broker
        gc.collect()  # earlier garbage: the freezes below would keep it for good
        await self.services.seams.start()  # the ban table (services.auth.admission)
        started = await bootstrap.start(broker.logstate, self.services.state, settings.node_id)
        self.started_from = started.source
        self.replayed = started.loaded + started.replayed
        broker.logstate.after_replay()
        if self.services.cluster is not None:
            await self.services.cluster.start(broker)  # join: peers link to us from now on
        broker.orphans.restarted()  # wills a previous run of this node was to publish
        await self.services.events.warm()  # else the first CONNACK waits ~0.5 s for it
        gc.freeze()
        self.listeners = open_listeners(settings, broker, self.services.seams.metrics)
        if settings.http_port is not None:
            config = api_config(settings, self.services, self.version)
            self.api = Api(broker, self.listeners, config, cluster=lambda: self.cluster_figures,
                           bridge_stats=self.bridge_stats)  # fmt: skip
            await self.api.start()  # the key file's keys, before the port answers
        self.metrics_service = MetricsService(
            broker.metrics, settings.node_id, self.version, broker.publish_sys,
            http_host=settings.http_host, http_port=settings.http_port,
            sys_interval_s=settings.sys_interval_s,
            max_connections=settings.limits.max_connections, refresh=self._figures,
            routes=self.api.routes if self.api is not None else None,
            http_ssl=http_ssl_context(settings.http_certfile, settings.http_keyfile)
            if settings.http_certfile and settings.http_keyfile else None,
        )  # fmt: skip
        if settings.sys_client_events:
            self._client_events(broker)
        try:
            for listener in self.listeners:
                await listener.bind(loop, self.reuse_port)
                assert listener.server is not None
                self._servers.append(listener.server)
            await self.metrics_service.start()  # /metrics answers before the node is ready
            self.http_port = self.metrics_service.http_port
            if self.api is not None and self.http_port is not None:
                scheme = "https" if settings.http_certfile else "http"
                await self.api.announce(settings.http_host, self.http_port, scheme)
        except OSError:
            await self.metrics_service.stop()
            await self._close_servers()
            if self.services.cluster is not None:
                await self.services.cluster.stop()
            raise
        ports = {listener.name: listener.port for listener in self.listeners}
        self.mqtt_port, self.ws_port = ports["mqtt"], ports.get("ws")
        broker.logstate.start_tail()
        self._viewdump = viewdump.start(broker, self.services.state)
        self.cluster_figures = ClusterFigures(
            settings.node_id, broker.metrics, self.services.figures or MemoryFigures(),
            broker.publish_local if settings.sys_interval_s > 0 else None,
            settings.sys_interval_s, refresh=self.metrics_service.figures,
        )  # fmt: skip
        self.cluster_figures.start(loop)
        await self._start_ingress(broker, loop)

    async def _start_ingress(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        """The Kafka -> MQTT bridges, last: their messages need every route the
        log holds (replayed above), or a persistent subscriber would miss one
        whose offset is then committed."""
        tables = self.settings.bridge.kafka_in
        if not tables:
            return
        from services.bridge.ingress import KafkaIngresses

        bootstrap = self.services.endpoints[1] if self.services.endpoints else None
        self.ingress = KafkaIngresses.build(tables, bootstrap, broker.publish_inside, loop)
        await self.ingress.start()
        for bridge in self.ingress.bridges:
            print(f"weir: {bridge.describe()}", flush=True)

    def bridge_stats(self) -> list[BridgeStats]:
        """Every data bridge's figures and state: out (the egress), then in."""
        egress = self.services.seams.egress
        out = egress.stats() if egress is not None else []
        return [*out, *(self.ingress.stats() if self.ingress is not None else [])]

    def _figures(self, m: Metrics) -> None:
        """What the metrics read: the broker's gauges, the bridges' figures."""
        if self.broker is not None:
            self.broker.figures(m)
        m.bridges = [BridgeFigures(s.name, s.direction, s.state, s.figures())
                     for s in self.bridge_stats()]  # fmt: skip

    def _client_events(self, broker: Broker) -> None:
        """$SYS/.../clients/<id>/connected|disconnected, on the client hook points."""

        def details(client_id: str) -> dict[str, object]:
            session = broker.sessions.get(client_id)
            if session is None or session.conn is None:
                return {}
            return {"keepalive": session.conn.channel.keep_alive,
                    "expiry_interval": session.expiry_s}  # fmt: skip

        events = ClientEvents(self.settings.node_id, broker.publish_sys, details)
        hooks = self.services.seams.hooks
        hooks.add("client.connected", events.connected)
        hooks.add("client.disconnected", events.disconnected)
        self.client_events = events

    async def _close_servers(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    async def stop(
        self, reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN, reference: str | None = None
    ) -> None:
        """Stop; a drain passes 0x9C "use another server" and the 5.0 Server Reference."""
        broker = self.broker
        if self.ingress is not None:  # first: what it has in flight is routed, then committed
            await self.ingress.close()
        for listener in self.listeners:
            listener.close()
        if self.metrics_service is not None:
            await self.metrics_service.stop()
        if self.cluster_figures is not None:
            await self.cluster_figures.stop()
        self.tracer.close()  # running traces end ("node"); their files stay
        if broker is not None:
            broker.disconnect_all(reason_code, reference)
            grace = self.settings.limits.shutdown_grace_s
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            await broker.wait_no_connections(grace)
            for conn in list(broker.connections):
                if conn.transport is not None:
                    conn.transport.abort()  # type: ignore[attr-defined]
            await broker.drain_tasks(max(0.0, deadline - loop.time()))
            broker.close()
            await broker.logstate.stop_tail()
        await viewdump.stop(self._viewdump)
        if self.client_events is not None:  # the hooks outlive the node (tests reuse them)
            hooks = self.services.seams.hooks
            hooks.remove("client.connected", self.client_events.connected)
            hooks.remove("client.disconnected", self.client_events.disconnected)
        await self.services.seams.stop()
        await self.services.seams.close()
        if self.api is not None:
            await self.api.close()
        if self.services.cluster is not None:
            await self.services.cluster.stop()
        if self.wheel is not None:
            self.wheel.close()
        await self._close_servers()
        gc.unfreeze()  # the node's state (and all else frozen) may be collected again

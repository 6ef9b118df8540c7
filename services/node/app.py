"""Composition root and `weir up`.

`open_backends(settings)` is the one place that picks implementations:

- `--backend memory`: one process, memory session/queue stores and a
  memory event log (`build_services`); nothing survives the process.
- otherwise Redis and Kafka: `--redis URL` / `--kafka HOST:PORT` name
  existing ones; whichever is not named is started here, embedded, on a
  free loopback port: a redis-server with its data under `--data-dir`
  (AOF profile `--durability default|durable`, see
  `services.embedded.redis_server`) and the embedded Kafka-protocol broker
  (Tansu, memory only). Clean sessions use memory stores, persistent ones
  Redis (`services.broker.stores`); every node uses the Kafka event log.
  Embedded services stop after the node.

`weir up` (`up`, its flags derived from `services.config`) loads settings,
runs one node until SIGINT/SIGTERM, and maps failures to exit codes: 2 for
bad configuration (one line naming the option and where it came from),
1 when the node cannot start (a port in use, Redis or Kafka unreachable,
redis-server missing: one line on stderr), 0 after a clean shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from services import logs
from services.cli import CONTEXT, Command, run
from services.config import Settings, SettingsError, exposure_error, load
from services.config.flags import given, settings_flags
from services.machine.backends import BackendError, launch_backends

if TYPE_CHECKING:
    from services.broker.seams import Seams
    from services.cluster.api import Membership
    from services.cluster.router import ClusterRouter
    from services.node.node import Services

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2


UP_HELP = (
    "Run a Weir MQTT broker node. Every option below is also a key of the --config file "
    "(weir config example) and some a WEIR_* variable; weir config show says which value wins."
)


@click.command("up", cls=Command, help=UP_HELP, context_settings=CONTEXT)
@click.option("--config", help="TOML config file (default: $WEIR_CONFIG)")
@settings_flags()
@click.option(
    "--workers", type=int,
    help="run N node processes sharing the MQTT port (SO_REUSEPORT), each a cluster node "
    "<node-id>-<i> on the shared Redis and Kafka, restarted if it dies "
    "(see services.machine.supervisor)",
)  # fmt: skip
@click.option(
    "--nodes", type=int,
    help="run N cluster nodes <node-id>-<i> on consecutive MQTT (and WebSocket) ports from "
    "--mqtt-port, on one Redis and Kafka, restarted if they die; pid and log files in "
    "<data-dir>/nodes (see services.machine.supervisor)",
)  # fmt: skip
@click.option(
    "--spark", is_flag=True,
    help="also run the state-store Spark job (streams/), which records the offsets nodes "
    "start from and the drift check's reference (the embedded default keeps its state "
    "without it)",
)  # fmt: skip
@click.option("--reuse-port", is_flag=True, hidden=True)  # a worker of --workers
@click.option("--embedded-log", is_flag=True, hidden=True)  # on its supervisor's embedded Kafka
def up(
    config: str | None, workers: int | None, nodes: int | None, spark: bool, reuse_port: bool,
    embedded_log: bool, **flags: Any,
) -> int:  # fmt: skip
    settings = load({"config": config, **given(flags)})
    exposed = exposure_error(settings)
    if exposed is not None:
        raise SettingsError(exposed)
    seams_for(settings)  # a missing or malformed password, key, ACL file or plugin: exit 2
    if settings.api_key_file:  # a missing or malformed API key file: exit 2, before anything
        from services.api.keys import read_key_file

        read_key_file(settings.api_key_file)
    if workers is not None or nodes is not None:
        from services.machine.supervisor import supervise

        return supervise(settings, nodes, workers, spark=spark)
    if spark and settings.backend == "memory":
        raise SettingsError("--spark needs Redis and Kafka; --backend memory has neither")
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        reread = functools.partial(load, {"config": config, **given(flags)})
        return runner.run(serve(
            settings, reuse_port=reuse_port, spark=spark, embedded_log=embedded_log,
            reread=reread,
        ))  # fmt: skip


def parse_args(argv: Sequence[str]) -> dict[str, Any]:
    """`weir up`'s settings flags in `argv`, by dotted path (and config), for `load`."""
    params = up.make_context("weir up", list(argv)).params
    return {"config": params["config"], **given(params)}


def build_services(settings: Settings) -> Services:
    """The pure-memory backends (`--backend memory`)."""
    from services.broker.seams import admitting
    from services.event.memory import MemoryEventLog
    from services.node.node import Services
    from services.queue.memory import MemoryQueueStore
    from services.retain.store import MemoryRetainStore
    from services.session.memory import MemorySessionStore

    sessions = MemorySessionStore()
    limits = settings.limits
    queue = MemoryQueueStore(sessions, limit=limits.queue_limit, full=limits.queue_full)
    return Services(
        sessions=sessions,
        queue=queue,
        retain=MemoryRetainStore(),
        events=MemoryEventLog(),
        seams=admitting(seams_for(settings), settings.limits),
    )


def seams_for(settings: Settings, redis: Any = None) -> Seams:
    """The authentication (a chain of backends, or none) and the ACL (a file or
    the built-in rules, then per-user Redis rules if asked and a Redis is
    there) the settings ask for. A missing or malformed file: SettingsError."""
    from services.auth.acl import Acl
    from services.auth.aclfile import AclFileError
    from services.auth.aclredis import RedisAcl
    from services.auth.scramkey import FileSecret, RedisSecret
    from services.broker.seams import Seams
    from services.hooks.api import Hooks
    from services.hooks.plugins import PluginError, Plugins
    from services.node.authn import authenticator, enhanced

    try:
        acl_redis = RedisAcl(redis) if settings.acl_redis and redis is not None else None
        acl = Acl(settings.acl_file, settings.acl_no_match, acl_redis)
    except AclFileError as exc:
        raise SettingsError(str(exc)) from None
    authn = authenticator(settings, redis)
    hooks = Hooks()
    plugins = Plugins(hooks)
    try:
        plugins.load_named((p.name, p.config) for p in settings.plugin)
    except PluginError as exc:
        raise SettingsError(str(exc)) from None
    # Unknown SCRAM users' salts: from a secret every worker and node shares
    # (read lazily: a settings check creates nothing).
    mock = RedisSecret(redis) if redis is not None else FileSecret(settings.data_dir)
    return Seams(authenticator=authn, authorizer=acl, hooks=hooks, enhanced=enhanced(authn, mock),
                 plugins=plugins)  # fmt: skip


WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def cluster_router(settings: Settings, membership: Membership) -> ClusterRouter:
    """This node's cluster membership and links; the link listens beside MQTT
    on a free port and is advertised under the MQTT host, or this machine's
    name when MQTT listens on every interface."""
    import socket

    from services.cluster.router import ClusterRouter

    host = settings.listeners.host
    advertise = socket.gethostname() if host in WILDCARD_HOSTS else host
    return ClusterRouter(
        settings.node_id,
        membership,
        host=host,
        advertise_host=advertise,
    )


REDIS_START_TIMEOUT_S = 5.0  # a reachable Redis answers PING in milliseconds


@contextlib.asynccontextmanager
async def open_backends(
    settings: Settings, embedded_log: bool = False
) -> AsyncIterator[tuple[Services, str]]:
    """The node's backends and a one-line description; stops what it started.
    An embedded Kafka's log is written through to the state store (node.embedded)."""
    if settings.backend == "memory":
        async with bridged(settings, build_services(settings), None) as services:
            yield services, "memory backends"
        return
    started: list[Any] = []
    closers: list[Any] = []
    try:
        # The embedded processes start first; they load their data while
        # this process imports what it needs.
        backends_ready = launch_backends(settings, started)
        from services.broker.seams import admitting
        from services.broker.stores import TieredQueueStore, TieredSessionStore, Tiers
        from services.cluster.membership import RedisMembership
        from services.embedded.redis_server import RedisServer
        from services.metrics.cluster import RedisFigures
        from services.node.node import Services  # and the node's own imports, meanwhile
        from services.queue.api import DROP_OLDEST
        from services.queue.memory import MemoryQueueStore
        from services.queue.redis import RedisQueueStore
        from services.retain.store import MemoryRetainStore
        from services.session.api import SessionError
        from services.session.memory import MemorySessionStore
        from services.session.redis import RedisSessionStore, RedisWillStore, bounded, connect
        from services.state.redis import RedisStateStore

        redis_url, bootstrap = backends_ready()
        client = connect(redis_url, REDIS_START_TIMEOUT_S)
        closers.append(client.aclose)
        try:
            await bounded(client.ping(), REDIS_START_TIMEOUT_S)
        except SessionError as exc:
            raise BackendError(f"cannot reach Redis at {redis_url}: {exc}") from None
        from services.node.embedded import event_log

        events = event_log(settings, bootstrap, client, started, embedded_log)
        closers.append(events.close)
        tiers = Tiers()
        memory_sessions = MemorySessionStore()
        node = settings.node_id  # the stores keep this node's indexes of what it owns
        wait = settings.redis_wait  # replicas each script's writes reach before its answer
        durable = RedisSessionStore(client, node=node, replicas=wait)
        sessions = TieredSessionStore(memory_sessions, durable, tiers)
        wills = RedisWillStore(client, node=node, replicas=wait)
        limits = settings.limits
        queue = TieredQueueStore(
            # Clean sessions die with their connection anyway: drop the oldest.
            MemoryQueueStore(memory_sessions, limit=limits.queue_limit, full=DROP_OLDEST),
            RedisQueueStore(client, limits.queue_limit, full=limits.queue_full, replicas=wait),
            tiers,
        )
        # Membership has connections of its own: behind the stores' calls in
        # their pool (64 at most, then callers wait) a busy node's beat could
        # miss its half TTL and fence the node; its beats go from a thread on
        # one more (services.cluster.beats).
        membership = RedisMembership.from_url(redis_url, settings.cluster_ttl_s)
        closers.append(membership.close)
        services = Services(
            sessions=sessions,
            queue=queue,
            retain=MemoryRetainStore(),
            events=events,
            cluster=cluster_router(settings, membership),
            state=RedisStateStore(client, settings.kafka_topic_prefix),
            endpoints=(redis_url, bootstrap),
            seams=admitting(seams_for(settings, client), settings.limits, client),
            wills=wills,
            figures=RedisFigures(client),
        )
        what = f"redis {redis_url}, kafka {bootstrap}"
        if started:
            what += "; embedded " + " and ".join(
                "redis-server" if isinstance(s, RedisServer) else "Kafka" for s in started
            )
        async with bridged(settings, services, bootstrap) as services:
            yield services, what
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                await close()
        for service in reversed(started):
            with contextlib.suppress(Exception):
                service.stop()


@contextlib.asynccontextmanager
async def bridged(
    settings: Settings, services: Services, bootstrap: str | None
) -> AsyncIterator[Services]:
    """`services` with the data bridges the settings ask for (`[[bridge.kafka_out]]`,
    on their own Kafka or `bootstrap`, the event log's), closed after the node."""
    tables = settings.bridge.kafka_out
    if not tables:
        yield services
        return
    import dataclasses

    from services.bridge.kafka import KafkaBridges

    bridges = KafkaBridges.build(tables, bootstrap, asyncio.get_running_loop())
    try:
        await bridges.start()
        for bridge in bridges.bridges:
            print(f"weir: {bridge.describe()}", flush=True)
        yield dataclasses.replace(
            services, seams=dataclasses.replace(services.seams, egress=bridges)
        )
    finally:
        await bridges.close()


async def serve(
    settings: Settings,
    ready: asyncio.Event | None = None,
    reuse_port: bool = False,
    spark: bool = False,
    embedded_log: bool = False,
    reread: Callable[[], Settings] | None = None,
) -> int:
    try:
        async with open_backends(settings, embedded_log) as (services, what):
            return await _serve(settings, services, what, ready, reuse_port, spark, reread)
    except BackendError as exc:
        print(f"weir: {exc}", file=sys.stderr)
        return EXIT_START_FAILED


async def _serve(
    settings: Settings,
    services: Services,
    what: str,
    ready: asyncio.Event | None,
    reuse_port: bool = False,
    spark: bool = False,
    reread: Callable[[], Settings] | None = None,
) -> int:
    from services.api import local
    from services.embedded import endpoints
    from services.event.api import EventLogError
    from services.mqtt.packets import ReasonCode
    from services.node import authn, embedded, logcut
    from services.node.node import Node
    from services.state.store import StateStoreError
    from services.store.errors import StoreUnavailable

    node = Node(settings, services, reuse_port=reuse_port)
    try:
        await node.start()
    except OSError as exc:
        listeners = settings.listeners
        print(
            f"weir: cannot listen on {listeners.host} (mqtt {listeners.mqtt_port}, "
            f"ws {listeners.ws_port}; http {settings.http_host}:{settings.http_port}): "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        await node.stop()
        return EXIT_START_FAILED
    except (EventLogError, StateStoreError) as exc:
        print(f"weir: cannot read the event log: {exc}", file=sys.stderr)
        await node.stop()
        return EXIT_START_FAILED
    except StoreUnavailable as exc:  # Redis went away since the start's PING
        print(f"weir: cannot store the --api-key-file keys: {exc}", file=sys.stderr)
        await node.stop()
        return EXIT_START_FAILED
    stop = asyncio.Event()
    draining = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def drain() -> None:
        draining.set()
        stop.set()

    loop.add_signal_handler(signal.SIGUSR1, drain)
    local_key = None  # `weir ctl` gets in with it (services.embedded.localkey)
    if node.api is not None and node.http_port is not None:
        try:
            local_key = await local.make(node.api.store, settings.data_dir, settings.node_id)
        except StoreUnavailable as exc:
            print(f"weir: no key for local tools (weir ctl needs --api-key): {exc}", flush=True)
    scheme = "https" if settings.http_certfile else "http"
    http_at = f"{scheme}://{settings.http_host}:{node.http_port}" if node.http_port else None
    redis_url, kafka = services.endpoints or (None, None)  # `weir ban`, `weir ctl`... find us
    endpoints.announce(
        settings.data_dir, redis_url, kafka, settings.kafka_topic_prefix, settings.node_id,
        f"{settings.listeners.host}:{node.mqtt_port}", http_at,
    )  # fmt: skip
    ws = f", ws on {settings.listeners.host}:{node.ws_port}" if node.ws_port else ""
    http = f", http on {settings.http_host}:{node.http_port}" if node.http_port else ""
    print(
        f"weir: node {settings.node_id} ready, mqtt on "
        f"{settings.listeners.host}:{node.mqtt_port}{ws}{http} ({what})",
        flush=True,
    )
    print(f"weir: {authn.who_gets_in(settings)}", flush=True)
    print("\n".join(f"weir: {x.describe()}" for x in node.listeners), flush=True)
    def reload() -> None:
        print("weir: SIGHUP: reading the ACL file again", flush=True)
        services.seams.reload()
        if reread is not None:  # the log level, from the config file (flags still win)
            try:
                level = reread().log_level
            except SettingsError as exc:
                print(f"weir: SIGHUP: log level kept: {exc}", flush=True)
                return
            logs.set_level(level)
            print(f"weir: SIGHUP: log level {level}", flush=True)

    loop.add_signal_handler(signal.SIGHUP, reload)
    job = None
    if spark and services.endpoints is not None:
        from services.machine import sparkjob

        job = sparkjob.start(settings, *services.endpoints)
        print(
            f"weir: state-store Spark job started (pid {job.pid}, log "
            f"{sparkjob.log_path(settings)})",
            flush=True,
        )
    elif "embedded" in what:
        print(embedded.kept_note(settings), flush=True)
    assert node.broker is not None
    cutter = None if spark else logcut.start(node.broker.logstate, services.state, settings.node_id)
    if spark and services.endpoints is not None and "embedded" in what:
        print(logcut.NOT_CUT_WITH_SPARK, flush=True)
    if reread is not None:  # `weir up`: structured logs from here on (services.logs); the
        # lines up to here stay plain, as scripts and the supervisor read them (ready, or why not)
        logs.setup(settings.log_level, settings.node_id)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await logcut.stop(cutter)  # no cut under a stopping node
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if local_key is not None and node.api is not None:
            await local.forget(node.api.store, settings.data_dir, local_key)
        if draining.is_set():  # clients go elsewhere: 5.0 ones are told where
            print("weir: draining: clients told to use another server", flush=True)
            await node.stop(ReasonCode.USE_ANOTHER_SERVER, settings.server_reference)
        else:
            await node.stop()  # the seams too (the authenticator's connections)
        if job is not None:
            from services.machine import sparkjob

            code = await asyncio.to_thread(sparkjob.stop, job)
            print(f"weir: state-store Spark job stopped (exit {code})", flush=True)
        endpoints.remove(settings.data_dir)
    return EXIT_OK


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def main(argv: Sequence[str]) -> int:
    return run(up, argv, "weir up")

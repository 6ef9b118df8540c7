"""The settings tree: every option of a node, declared once (`opt`).

Each field is one option: its type and bounds validate it, `opt()` gives
its help, unit, WEIR_* variable and flag (`services.config.declare`). The
TOML key is the dotted path: `node_id`, `[listeners] mqtt_port`,
`[limits] queue_limit`; `[[listener]]`, `[[auth]]`, `[[bridge.kafka_out]]`,
`[[bridge.kafka_in]]` and `[[rule]]` tables fill `listeners.tables`, `auth`,
`bridge.*` and `rule`. Rules across
fields are model validators here, so a file, the environment, the flags and `weir config check` all
get them. Every limit is a named constant with its unit and why.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import ssl
from typing import Annotated

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from services.config.auth import AuthBackend, AuthKind, chain
from services.config.bridges import Bridges, KafkaIn, KafkaOut
from services.config.declare import (
    FROZEN,
    Bool,
    HttpUrl,
    Int,
    KafkaBootstrap,
    OptionalPort,
    RateText,
    RedisUrl,
    Seconds,
    Text,
    opt,
)
from services.config.listeners import Listeners
from services.config.plugins import LogLevel, PluginTables
from services.config.redisurl import is_cluster_url
from services.config.rules import Rules

# Limits.
MAX_CONNECTIONS = 19_000  # connections; the process may open 20,000 files (DESIGN 11)
MAX_PACKET_SIZE = 1 << 20  # bytes (1 MiB): bounds per-connection buffer memory
RECEIVE_MAXIMUM = 32  # unacknowledged incoming QoS 1/2 PUBLISHes per client (EMQX's default)
MAX_AWAITING_REL = 100  # incoming QoS 2 messages awaiting PUBREL per 5.0 client (EMQX's
#   max_awaiting_rel default); past it PUBREC 0x97 (docs/limits.md)
QUEUE_LIMIT = 1000  # messages per offline/overflow queue, as Mosquitto's max_queued_messages
MAX_KEEP_ALIVE_S = 65_535  # seconds; the largest keep alive MQTT can express (a 5.0
#   client asking for more is told this; 0, no keep alive, stays allowed as the spec says)
OUTBOUND_HIGH_WATER = 64 * 1024  # bytes in a transport's write buffer before we stop
#   reading from that client (uvloop's own default high-water mark)
OUTBOUND_LOW_WATER = 16 * 1024  # bytes: resume reading once the buffer drains to this
SUBSCRIBER_QUEUE_BYTES = 1 << 20  # bytes of QoS 0 PUBLISHes held for one slow
#   subscriber beyond its transport buffer; past it QoS 0 messages are dropped and counted
SHUTDOWN_GRACE_S = 5.0  # seconds to flush DISCONNECTs before closing sockets anyway
# Flapping (services.auth.banned): off by default as in EMQX; on, EMQX's
# defaults: 15 connects in 1 min -> banned 5 min.
FLAPPING_MAX_CONNECTS = 15  # CONNECTs of one client id within the window
FLAPPING_WINDOW_S = 60.0
FLAPPING_BAN_S = 300.0
EVENT_APPEND_TIMEOUT_S = 5.0  # seconds a CONNACK/SUBACK waits for the log's ack before failing
CLUSTER_TTL_S = 10.0  # seconds without a heartbeat before a node is dead and taken over
HTTP_PORT = 18083  # the node's HTTP port (/metrics, the management API): EMQX's dashboard port
SYS_INTERVAL_S = 10.0  # seconds between $SYS publishes: Mosquitto's and EMQX's default
DEFAULT_KAFKA_TOPIC_PREFIX = "weir."
DEFAULT_DATA_DIR = "./weir-data"
RATE = "(a rate as 100/second or 10 per 5 seconds)"


class RateStorage(enum.StrEnum):  # where connection rates and flapping are counted
    MEMORY = "memory"
    REDIS = "redis"


class QueueFull(enum.StrEnum):  # services.queue.api, at a persistent session's queue bound
    REFUSE = "refuse"
    DROP_OLDEST = "drop_oldest"


class SharedStrategy(enum.StrEnum):
    """Which member of a `$share` group gets a message (services.broker.shared),
    named as EMQX's broker.shared_subscription_strategy."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"  # per publisher, per group (EMQX's round_robin, its default)
    ROUND_ROBIN_PER_GROUP = "round_robin_per_group"  # per node, per group
    STICKY = "sticky"  # one member per publisher until it leaves
    HASH_CLIENTID = "hash_clientid"  # by the publisher's client id
    HASH_TOPIC = "hash_topic"  # by the message's topic
    LOCAL = "local"  # random among this node's members, any member when it has none


class AclNoMatch(enum.StrEnum):  # what a publish / subscribe that no ACL rule matched gets
    ALLOW = "allow"
    DENY = "deny"


class Backend(enum.StrEnum):
    EMBEDDED = "embedded"  # Redis and Kafka, started on free loopback ports unless named
    MEMORY = "memory"  # one process, no Redis, no Kafka


class Durability(enum.StrEnum):  # the embedded redis-server's AOF profile
    DEFAULT = "default"  # fsync every second
    DURABLE = "durable"  # fsync every write


SHARED_STRATEGIES = tuple(SharedStrategy)
QUEUE_FULL_POLICIES = tuple(QueueFull)


@dataclass(frozen=True, slots=True, config=FROZEN)
class Limits:
    """The [limits] section: what one node and one client may use."""

    max_connections: Annotated[Int, Field(ge=1)] = opt(
        MAX_CONNECTIONS, "connections this node holds; past it a CONNECT gets CONNACK 0x97 "
        "(3.x: 3)", unit="connections")  # fmt: skip
    max_packet_size: Annotated[Int, Field(ge=64, le=268_435_460)] = opt(
        MAX_PACKET_SIZE, "largest MQTT packet", unit="bytes"
    )
    receive_maximum: Annotated[Int, Field(ge=1, le=65_535)] = opt(
        RECEIVE_MAXIMUM, "unacknowledged QoS 1/2 PUBLISHes a 5.0 client may send at once; "
        "past it the node reads no more from that client until its acks go out")  # fmt: skip
    strict_receive_maximum: Bool = opt(
        False, "disconnect a 5.0 client past the Receive Maximum (DISCONNECT 0x93) instead "
        "of slowing it; MQTT.js 5 does not keep to it")  # fmt: skip
    max_awaiting_rel: Annotated[Int, Field(ge=0, le=65_535)] = opt(
        MAX_AWAITING_REL, "incoming QoS 2 messages a 5.0 client may leave awaiting PUBREL "
        "(0: no bound); a new one past it gets PUBREC 0x97")  # fmt: skip
    queue_limit: Annotated[Int, Field(ge=1)] = opt(
        QUEUE_LIMIT, "messages queued per session (offline or behind its inflight window)",
        unit="messages")  # fmt: skip
    queue_full: QueueFull = opt(
        QueueFull.REFUSE, "at a persistent session's queue bound: refuse (QoS 1/2 publishers "
        "get 0x97, 3.x ones are disconnected and resend) or drop_oldest (as EMQX)")  # fmt: skip
    max_keep_alive_s: Annotated[Int, Field(ge=0, le=MAX_KEEP_ALIVE_S)] = opt(
        MAX_KEEP_ALIVE_S, "largest keep alive; a 5.0 client's larger one is lowered to it, a "
        "3.x client's is refused (CONNACK 2)", flag="--max-keep-alive", unit="s")  # fmt: skip
    outbound_high_water: Annotated[Int, Field(ge=1024)] = opt(
        OUTBOUND_HIGH_WATER, "a client's transport write buffer above which reading from it "
        "stops", unit="bytes")  # fmt: skip
    outbound_low_water: Annotated[Int, Field(ge=0)] = opt(
        OUTBOUND_LOW_WATER, "reading resumes once the write buffer drains to this", unit="bytes"
    )
    subscriber_queue_bytes: Annotated[Int, Field(ge=0)] = opt(
        SUBSCRIBER_QUEUE_BYTES, "QoS 0 PUBLISHes held for one slow subscriber beyond its "
        "transport buffer; past it QoS 0 messages are dropped and counted",
        unit="bytes")  # fmt: skip
    shutdown_grace_s: Annotated[Seconds, Field(ge=0.0)] = opt(
        SHUTDOWN_GRACE_S, "time to flush DISCONNECTs before sockets are closed anyway", unit="s"
    )
    max_conn_rate: RateText | None = opt(
        None, f"CONNECTs per listener; over: CONNACK 0x9F (3.x: 3) {RATE}")
    max_conn_rate_per_ip: RateText | None = opt(
        None, f"CONNECTs per client address; over: CONNACK 0x9F (3.x: 3) {RATE}")
    client_msg_rate: RateText | None = opt(
        None, f"PUBLISHes read per client; over: reading pauses, nothing dropped {RATE}")
    client_byte_rate: RateText | None = opt(
        None, f"bytes read per client; over: reading pauses, nothing dropped {RATE}")
    max_subscriptions: Annotated[Int, Field(ge=0)] = opt(
        0, "topic filters per client (0: no limit); past it SUBACK 0x97 (3.x: 0x80)")
    max_inflight: Annotated[Int, Field(ge=0, le=65_535)] = opt(
        0, "QoS 1/2 messages out to a client unacknowledged (0: 3.x 32, 5.0 its Receive "
        "Maximum); 5.0 clients get at most their Receive Maximum")  # fmt: skip
    rate_storage: RateStorage = opt(
        RateStorage.MEMORY, "memory (per node) or redis (cluster-wide) for connection rates "
        "and flapping")  # fmt: skip
    flapping: Bool = opt(
        False, "ban a client id that connects too often (15 times in 60 s: 300 s)")
    flapping_max_connects: Annotated[Int, Field(ge=1)] = opt(
        FLAPPING_MAX_CONNECTS, "CONNECTs of one client id allowed in the flapping window")
    flapping_max_connects_ip: Annotated[Int, Field(ge=0)] = opt(
        0, "CONNECTs from one address allowed in the flapping window (0: not counted)")
    flapping_window_s: Annotated[Seconds, Field(ge=1.0)] = opt(
        FLAPPING_WINDOW_S, "flapping window", flag="--flapping-window", unit="s")
    flapping_ban_s: Annotated[Seconds, Field(ge=1.0)] = opt(
        FLAPPING_BAN_S, "how long a flapping client is banned", flag="--flapping-ban", unit="s")

    @model_validator(mode="after")
    def _water_marks(self) -> Limits:
        if self.outbound_low_water > self.outbound_high_water:
            raise ValueError("limits.outbound_low_water is above limits.outbound_high_water")
        return self


def _node_id() -> str:
    return f"weir-{socket.gethostname()}"


@dataclass(frozen=True, slots=True, config=FROZEN)
class Settings:
    """A node's settings (the file's top level, and its sections)."""

    node_id: Text = opt(help="this node's id", env="WEIR_NODE_ID",
                        factory=_node_id)  # fmt: skip
    listeners: Listeners = opt(factory=Listeners, flag=False)
    limits: Limits = opt(factory=Limits, flag=False)
    data_dir: Text = opt(DEFAULT_DATA_DIR, "directory for node data", env="WEIR_DATA_DIR")
    redis_url: RedisUrl | None = opt(
        None, "use this Redis (redis://host:port/db); none: the embedded one",
        env="WEIR_REDIS_URL", flag="--redis")  # fmt: skip
    redis_wait: Annotated[Int, Field(ge=0)] = opt(
        0, "after each Redis script (a session change, a message stored) WAIT until this "
        "many replicas have it, so what is acknowledged after it survives a failover to one; "
        "fewer within 1 s: the call fails (0: no WAIT)", env="WEIR_REDIS_WAIT",
        unit="replicas")  # fmt: skip
    kafka_bootstrap: KafkaBootstrap | None = opt(
        None, "use this Kafka (HOST:PORT[,...]); none: the embedded one",
        env="WEIR_KAFKA_BOOTSTRAP", flag="--kafka")  # fmt: skip
    backend: Backend = opt(
        Backend.EMBEDDED, "embedded (Redis + Kafka, started here unless --redis/--kafka name "
        "them) or memory (one process, no Redis, no Kafka, nothing survives)")  # fmt: skip
    durability: Durability = opt(
        Durability.DEFAULT, "embedded redis-server AOF profile: default (fsync every second) "
        "or durable (fsync every write)")  # fmt: skip
    event_append_timeout_s: Annotated[Seconds, Field(ge=0.1)] = opt(
        EVENT_APPEND_TIMEOUT_S, "how long a CONNACK/SUBACK waits for the event log's ack",
        unit="s")  # fmt: skip
    kafka_topic_prefix: Text = opt(
        DEFAULT_KAFKA_TOPIC_PREFIX, "event topic prefix", env="WEIR_KAFKA_TOPIC_PREFIX")
    shared_subscription_strategy: SharedStrategy = opt(
        SharedStrategy.ROUND_ROBIN, "which $share group member gets a message: "
        + ", ".join(SharedStrategy))  # fmt: skip
    shared_local: Bool = opt(
        False, "a $share group's member on this node first, when it has one")
    allow_anonymous: Bool = opt(
        False, "let anonymous clients in on a listener that is not loopback (on loopback they "
        "are let in while no authentication is configured)",
        env="WEIR_ALLOW_ANONYMOUS")  # fmt: skip
    password_file: Text | None = opt(
        None, "authenticate clients against this file of argon2id hashes (weir passwd)",
        env="WEIR_PASSWORD_FILE")  # fmt: skip
    auth_redis: Bool = opt(
        False, "authenticate users kept in Redis (hash weir:user:<name>, field password_hash; "
        "weir passwd --redis URL USER)", env="WEIR_AUTH_REDIS")  # fmt: skip
    jwt_secret: Text | None = opt(
        None, "authenticate JWTs (in the password field) signed with this HMAC secret "
        "(HS256/384/512; WEIR_JWT_SECRET keeps it off the command line)",
        env="WEIR_JWT_SECRET")  # fmt: skip
    jwt_public_key: Text | None = opt(
        None, "authenticate JWTs signed with this PEM public key (RS*/PS*/ES*/EdDSA)",
        env="WEIR_JWT_PUBLIC_KEY")  # fmt: skip
    jwt_jwks: Text | None = opt(
        None, "authenticate JWTs signed with a key of this JWKS file (picked by kid; reread "
        "when it changes)", env="WEIR_JWT_JWKS")  # fmt: skip
    auth_http: HttpUrl | None = opt(
        None, 'ask this webhook (POST JSON clientid, username, password, peer; answer '
        '{"result": "allow"|"deny"|"ignore"}); [[auth]] sets its timeout, cache',
        env="WEIR_AUTH_HTTP")  # fmt: skip
    auth: tuple[AuthBackend, ...] = opt(
        (), "the authentication chain: the [[auth]] tables, then the shortcuts above", flag=False)
    acl_file: Text | None = opt(
        None, "authorize publish/subscribe by these ACL rules (TOML; default: the built-in "
        "rules, which keep $SYS/# and # itself to loopback); reread on SIGHUP and on change",
        env="WEIR_ACL_FILE")  # fmt: skip
    acl_no_match: AclNoMatch = opt(
        AclNoMatch.DENY, "allow or deny what no ACL rule matched", env="WEIR_ACL_NO_MATCH")
    acl_redis: Bool = opt(
        False, "also allow by per-user rules in Redis (hash weir:acl:<user>: topic -> action)",
        env="WEIR_ACL_REDIS")  # fmt: skip
    server_reference: Text | None = opt(
        None, "on a drain (SIGUSR1), MQTT 5 clients are told to use this server (host:port)")
    cluster_ttl_s: Annotated[Seconds, Field(ge=0.5)] = opt(
        CLUSTER_TTL_S, "time without a heartbeat after which a node is dead and its sessions "
        "and wills are taken over", flag="--cluster-ttl", unit="s")  # fmt: skip
    http_port: OptionalPort = opt(
        HTTP_PORT, "the node's HTTP port: Prometheus text at /metrics and the management API "
        "at /api/v5 (0: a free port, off: none)", env="WEIR_HTTP_PORT")  # fmt: skip
    http_host: Text = opt(
        "127.0.0.1", "address of the HTTP port (loopback by default; another one needs "
        "--http-certfile or --http-allow-insecure)",
        env="WEIR_HTTP_HOST")  # fmt: skip
    http_certfile: Text | None = opt(
        None, "serve the HTTP port (/metrics, the API) over TLS with this PEM certificate "
        "(with --http-keyfile)", env="WEIR_HTTP_CERTFILE")  # fmt: skip
    http_keyfile: Text | None = opt(
        None, "the HTTP port's TLS private key (PEM)", env="WEIR_HTTP_KEYFILE")
    http_allow_insecure: Bool = opt(
        False, "let the HTTP port listen on a non-loopback --http-host without TLS (API keys "
        "and secrets then cross the network in the clear)",
        env="WEIR_HTTP_ALLOW_INSECURE")  # fmt: skip
    api_key_file: Text | None = opt(
        None, "the management API's first keys: a file of key:secret lines (EMQX's bootstrap "
        "file), stored hashed at start; more with POST /api/v5/api_key (docs/api.md)",
        env="WEIR_API_KEY_FILE")  # fmt: skip
    sys_interval_s: Annotated[Seconds, Field(ge=0.0)] = opt(
        SYS_INTERVAL_S, "how often the node publishes its $SYS/brokers/<node>/... topics, "
        "retained (0: never)", flag="--sys-interval", unit="s")  # fmt: skip
    sys_client_events: Bool = opt(
        False, "publish $SYS/brokers/<node>/clients/<id>/connected|disconnected on each "
        "client's connect and disconnect (EMQX's event messages; JSON, not retained)",
        env="WEIR_SYS_CLIENT_EVENTS")  # fmt: skip
    bridge: Bridges = opt(factory=Bridges, flag=False)
    rule: Rules = opt(
        (), "the config file's [[rule]] tables: Spark SQL over the bridged messages, run by "
        "weir streams run rules (docs/rules.md)", flag=False)  # fmt: skip
    plugin: PluginTables = opt(
        (), "the config file's [[plugin]] tables, loaded in order (docs/plugins.md)", flag=False)
    log_level: LogLevel = opt(
        LogLevel.INFO, "log lines at this level and above; SIGHUP reads it from the config "
        "file again", env="WEIR_LOG_LEVEL")  # fmt: skip

    @model_validator(mode="after")
    def _chain(self) -> Settings:
        jwt = {k: v for k in ("secret", "public_key", "jwks")
               if (v := getattr(self, f"jwt_{k}")) is not None}  # fmt: skip
        built = chain(self.auth, self.password_file, self.auth_redis, jwt, self.auth_http)
        object.__setattr__(self, "auth", built)  # frozen; idempotent (chain dedupes)
        return self

    @model_validator(mode="after")
    def _http_tls(self) -> Settings:
        if (self.http_certfile is None) != (self.http_keyfile is None):
            raise ValueError("--http-certfile and --http-keyfile go together")
        if self.http_certfile is not None and self.http_keyfile is not None:
            try:
                http_ssl_context(self.http_certfile, self.http_keyfile)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--http-certfile/--http-keyfile: {exc}") from None
        return self

    @model_validator(mode="after")
    def _cluster_lacks(self) -> Settings:
        cluster = self.redis_url is not None and is_cluster_url(self.redis_url)
        if cluster and self.limits.rate_storage == RateStorage.REDIS:
            # `limits` is handed the node's pool, which a cluster client has not
            raise ValueError("--rate-storage redis does not run on Redis Cluster (yet): "
                             "use --rate-storage memory")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _memory_has_no_redis(self) -> Settings:
        if self.backend != Backend.MEMORY:
            return self
        if self.redis_wait:
            raise ValueError("--redis-wait needs Redis; --backend memory has none")
        if self.acl_redis or any(b.backend == AuthKind.REDIS for b in self.auth):
            raise ValueError("--acl-redis / --auth-redis need Redis; --backend memory has none")
        if self.limits.rate_storage == RateStorage.REDIS:
            raise ValueError("--rate-storage redis needs Redis; --backend memory has none")
        tables: list[KafkaOut | KafkaIn] = [*self.bridge.kafka_out, *self.bridge.kafka_in]
        for bridge in tables:
            if bridge.bootstrap is None:
                raise ValueError(f"bridge {bridge.name!r} needs a bootstrap: --backend memory "
                                 "has no Kafka of its own")  # fmt: skip
        return self


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def http_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """The HTTP port's server context (TLS 1.2+); OSError / ssl.SSLError for bad files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


def http_exposure_error(settings: Settings) -> str | None:
    """A non-loopback HTTP port needs TLS or an explicit flag: it carries API
    keys and secrets (and answers /metrics without one)."""
    if settings.http_port is None or is_loopback(settings.http_host):
        return None
    if settings.http_certfile is not None or settings.http_allow_insecure:
        return None
    return (
        f"the HTTP port (/metrics, the management API) listening on {settings.http_host} (not "
        "loopback) would carry API keys in the clear; give it TLS (--http-certfile and "
        "--http-keyfile), set http_allow_insecure = true (--http-allow-insecure) to accept "
        "that, or listen on 127.0.0.1"
    )


def exposure_error(settings: Settings) -> str | None:
    """Why a node with these settings must not start, or None. A listener
    that other machines can reach needs an authentication backend, client
    certificates it requires, or an explicit allow_anonymous (the node's or
    its own), as Mosquitto 2 asks. Checked when a node starts (`weir up`,
    `weir config check`), not by every reader of the settings: `weir ban`
    and `weir drain` read the same file to find Redis or the data dir."""
    http = http_exposure_error(settings)
    if http is not None:
        return http
    if settings.auth:
        return None
    for listener in settings.listeners.all():
        host = listener.host
        anonymous = listener.allow_anonymous
        if anonymous is None:
            anonymous = settings.allow_anonymous
        if is_loopback(host) or anonymous or listener.client_certs == "required":
            continue
        return (
            f"listener {listener.name}: listening on {host} (not loopback) would let any "
            "client in without authentication; configure authentication ([[auth]], "
            "--password-file, --jwt-secret, --auth-http, ...), "
            "require client certificates, or set allow_anonymous = true (--allow-anonymous, "
            "WEIR_ALLOW_ANONYMOUS=true) to accept that, or listen on 127.0.0.1"
        )
    return None

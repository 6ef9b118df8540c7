"""MQTT control packets as typed values, shared by codec, channel and node.

One immutable value (`values.value`) per control packet. Fields carry the union of
what MQTT 3.1 (protocol level 3), 3.1.1 (level 4) and 5.0 (level 5) can say;
the codec decides what is put on the wire for a given level (properties and
reason codes exist only in 5.0). Nothing here does I/O or validation: the
codec validates bytes, the channel validates behaviour.
"""

from __future__ import annotations

from enum import IntEnum

from services.mqtt.values import value


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ProtocolLevel(IntEnum):
    MQTT_3_1 = 3  # protocol name "MQIsdp"
    MQTT_3_1_1 = 4
    MQTT_5 = 5


class ReasonCode(IntEnum):
    """MQTT 5 reason codes (section 2.4). 0x00 doubles as granted QoS 0."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackCode311(IntEnum):
    """CONNACK return codes of MQTT 3.1 / 3.1.1."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


@value
class Properties:
    """MQTT 5 properties; None means absent. Only 5.0 puts these on the wire.

    `subscription_identifier` may repeat in PUBLISH (one per matching
    subscription), hence a tuple; `user_property` keeps order and repeats.
    Which properties a packet type may carry is checked by the codec.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifier: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_property: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


NO_PROPERTIES = Properties()


@value
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@value
class Connect:
    client_id: str
    protocol_level: int = ProtocolLevel.MQTT_3_1_1
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES
    protocol_name: str = "MQTT"  # "MQIsdp" for level 3


@value
class Connack:
    session_present: bool = False
    reason_code: int = 0  # ReasonCode on 5.0, ConnackCode311 on 3.x
    properties: Properties = NO_PROPERTIES


@value
class Publish:
    topic: str  # may be "" on 5.0 when properties.topic_alias is set
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # required for QoS 1 and 2, absent for QoS 0
    properties: Properties = NO_PROPERTIES


@value
class Puback:
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@value
class Pubrec:
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@value
class Pubrel:
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@value
class Pubcomp:
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@value
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (5.0 options default off)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0 send on subscribe, 1 only if new, 2 never


@value
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@value
class Suback:
    packet_id: int
    reason_codes: tuple[int, ...]  # granted QoS (0, 1, 2) or a failure code (0x80 on 3.1.1)
    properties: Properties = NO_PROPERTIES


@value
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@value
class Unsuback:
    packet_id: int
    reason_codes: tuple[int, ...] = ()  # 5.0 only; 3.x UNSUBACK carries none
    properties: Properties = NO_PROPERTIES


@value
class Pingreq:
    pass


@value
class Pingresp:
    pass


@value
class Disconnect:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@value
class Auth:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)

PACKET_TYPES: dict[type[object], PacketType] = {
    Connect: PacketType.CONNECT,
    Connack: PacketType.CONNACK,
    Publish: PacketType.PUBLISH,
    Puback: PacketType.PUBACK,
    Pubrec: PacketType.PUBREC,
    Pubrel: PacketType.PUBREL,
    Pubcomp: PacketType.PUBCOMP,
    Subscribe: PacketType.SUBSCRIBE,
    Suback: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE,
    Unsuback: PacketType.UNSUBACK,
    Pingreq: PacketType.PINGREQ,
    Pingresp: PacketType.PINGRESP,
    Disconnect: PacketType.DISCONNECT,
    Auth: PacketType.AUTH,
}


@value
class Message:
    """An application message as the broker routes, queues and retains it.

    `qos` and `retain` are as they will be delivered (the router has already
    applied the subscription's granted QoS and retain-as-published);
    `properties` never carries a topic alias. `expires_at_ms` is wall-clock
    milliseconds (so it means the same on every node), None for no expiry.
    `sender` is the publishing client id (no-local needs it). `share` is the
    shared subscription (group, filter) a QoS 1/2 or forwarded copy was
    dispatched for, None otherwise: it travels with the copy (link, queue),
    so the receiving node applies that subscription and a leaving member's
    copies can go to another member of the group. Never sent to a client.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES
    sender: str = ""
    expires_at_ms: int | None = None
    share: tuple[str, str] | None = None

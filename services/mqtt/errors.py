"""The protocol core's errors: one tree, each naming its MQTT reason code.

Raised by the codec for bytes that break the spec and by the channel for
packets that arrive where the state table does not allow them. The node
turns any of them into "DISCONNECT with `reason_code` (5.0, where the spec
allows it), then close". None is retriable: the connection is done.
"""

from __future__ import annotations

from services.mqtt.packets import ReasonCode


class MQTTError(Exception):
    reason_code: int = ReasonCode.UNSPECIFIED_ERROR
    retriable = False


class MalformedPacket(MQTTError):
    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    reason_code = ReasonCode.PROTOCOL_ERROR


class UnsupportedProtocolVersion(MQTTError):
    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


class ClientIdentifierNotValid(MQTTError):
    reason_code = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID


class PacketTooLarge(MQTTError):
    reason_code = ReasonCode.PACKET_TOO_LARGE


class TopicNameInvalid(MQTTError):
    reason_code = ReasonCode.TOPIC_NAME_INVALID


class TopicFilterInvalid(MQTTError):
    reason_code = ReasonCode.TOPIC_FILTER_INVALID


class TopicAliasInvalid(MQTTError):
    reason_code = ReasonCode.TOPIC_ALIAS_INVALID


class ReceiveMaximumExceeded(MQTTError):
    reason_code = ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


class QosNotSupported(MQTTError):
    reason_code = ReasonCode.QOS_NOT_SUPPORTED


class PayloadFormatInvalid(MQTTError):
    reason_code = ReasonCode.PAYLOAD_FORMAT_INVALID


class QuotaExceeded(MQTTError):
    """A limit of this server, not of the spec (packets before CONNACK, user properties)."""

    reason_code = ReasonCode.QUOTA_EXCEEDED


class UnsupportedProtocolLevel(UnsupportedProtocolVersion):
    """CONNECT named a protocol name / level pair Weir does not speak.

    `protocol_level` is the level byte the client sent: answer with 5.0's
    CONNACK 0x84 when it is 5, else with 3.1.1's CONNACK 0x01.
    """

    def __init__(self, message: str, protocol_level: int) -> None:
        super().__init__(message)
        self.protocol_level = protocol_level

"""Templates of a bridge's Kafka key, value and headers (kafka_out), and of
its MQTT topic and payload (kafka_in).

Theory of operation. A template ("${clientid}/${topic}") is compiled once,
when the bridge is built, into a tuple of parts: literal bytes, or the
function of a variable (checked by `services.config.bridges`). Rendering a
message (`Fields`) or a Kafka record (`Record`) joins the parts' bytes:
`${payload}` / `${value}` is the payload as it came (bytes, never decoded),
every other variable its UTF-8 text. A template that is exactly one
variable hands its bytes on without a copy. The default value of a
kafka_out record (no `value` in the table) is the JSON envelope, `envelope`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from services.config.bridges import HEADER, TEMPLATE_VARIABLE, USER_PROPERTY
from services.mqtt.packets import Message


@dataclass(frozen=True, slots=True)
class Fields:
    """What a template may name, for one message: the message and who sent it."""

    message: Message
    username: str | None
    timestamp_ms: int  # when this node received the PUBLISH


def _user_property(name: str) -> Callable[[Fields], bytes]:
    def value(fields: Fields) -> bytes:
        for key, found in fields.message.properties.user_property:
            if key == name:
                return found.encode()
        return b""

    return value


_VARIABLES: Final[dict[str, Callable[[Fields], bytes]]] = {
    "clientid": lambda f: f.message.sender.encode(),
    "username": lambda f: (f.username or "").encode(),
    "topic": lambda f: f.message.topic.encode(),
    "payload": lambda f: f.message.payload,
    "qos": lambda f: b"%d" % f.message.qos,
    "retain": lambda f: b"true" if f.message.retain else b"false",
    "timestamp": lambda f: b"%d" % f.timestamp_ms,
}

@dataclass(frozen=True, slots=True)
class Record:
    """What a kafka_in template may name: one Kafka record (confluent-kafka's
    `Message` is copied into this so templates need no Kafka client)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int  # the record's timestamp (CreateTime or LogAppendTime)
    headers: tuple[tuple[str, bytes], ...] = ()


def _header(name: str) -> Callable[[Record], bytes]:
    def value(record: Record) -> bytes:
        for key, found in record.headers:
            if key == name:
                return found
        return b""

    return value


_RECORD_VARIABLES: Final[dict[str, Callable[[Record], bytes]]] = {
    "key": lambda r: r.key or b"",
    "value": lambda r: r.value,
    "payload": lambda r: r.value,
    "topic": lambda r: r.topic.encode(),
    "partition": lambda r: b"%d" % r.partition,
    "offset": lambda r: b"%d" % r.offset,
    "timestamp": lambda r: b"%d" % r.timestamp_ms,
}

T = TypeVar("T")


class Template(Generic[T]):
    """A compiled template; `render(item)` gives its bytes."""

    __slots__ = ("_parts", "text")

    def __init__(
        self,
        text: str,
        variables: Mapping[str, Callable[[T], bytes]],
        prefix: str,
        by_name: Callable[[str], Callable[[T], bytes]],
    ) -> None:
        self.text = text
        parts: list[bytes | Callable[[T], bytes]] = []
        at = 0
        for found in TEMPLATE_VARIABLE.finditer(text):
            if found.start() > at:
                parts.append(text[at : found.start()].encode())
            name = found.group(1)
            if name.startswith(prefix):
                parts.append(by_name(name[len(prefix) :]))
            else:
                parts.append(variables[name])  # KeyError: config let an unknown one through
            at = found.end()
        if at < len(text):
            parts.append(text[at:].encode())
        self._parts = tuple(parts)

    def render(self, item: T) -> bytes:
        parts = self._parts
        if len(parts) == 1:
            part = parts[0]
            return part if isinstance(part, bytes) else part(item)
        return b"".join(p if isinstance(p, bytes) else p(item) for p in parts)


def message_template(text: str) -> Template[Fields]:
    """A kafka_out template, over a message (`Fields`)."""
    return Template(text, _VARIABLES, USER_PROPERTY, _user_property)


def record_template(text: str) -> Template[Record]:
    """A kafka_in template, over a Kafka record (`Record`)."""
    return Template(text, _RECORD_VARIABLES, HEADER, _header)


def envelope(fields: Fields) -> bytes:
    """The default value: the message as one JSON object. The payload is text
    when it is UTF-8 (`"payload_encoding": "utf-8"`), else base64."""
    message = fields.message
    try:
        payload, encoding = message.payload.decode(), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(message.payload).decode(), "base64"
    return json.dumps(
        {
            "topic": message.topic,
            "payload": payload,
            "payload_encoding": encoding,
            "qos": message.qos,
            "retain": message.retain,
            "clientid": message.sender,
            "username": fields.username,
            "timestamp": fields.timestamp_ms,
            "user_properties": [list(pair) for pair in message.properties.user_property],
        },
        separators=(",", ":"),
    ).encode()

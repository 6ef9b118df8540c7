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
import json.encoder
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from services.config.bridges import HEADER, TEMPLATE_VARIABLE, USER_PROPERTY
from services.mqtt.packets import Message

# A str as a JSON string literal, non-ASCII escaped: json.dumps's own (C) function.
_json_string: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii


@dataclass(slots=True)
class Fields:
    """What a template may name, for one message: the message and who sent it.
    (Not frozen: one is built per bridged message, and a frozen dataclass's
    `__init__` costs three `object.__setattr__` calls.)"""

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

    @property
    def renderer(self) -> Callable[[T], bytes]:
        """`render`, or for a template that is exactly one variable that
        variable's own function (a call less per message: the default key,
        `${clientid}`, is one)."""
        parts = self._parts
        if len(parts) == 1 and not isinstance(parts[0], bytes):
            return parts[0]
        return self.render


def message_template(text: str) -> Template[Fields]:
    """A kafka_out template, over a message (`Fields`)."""
    return Template(text, _VARIABLES, USER_PROPERTY, _user_property)


def record_template(text: str) -> Template[Record]:
    """A kafka_in template, over a Kafka record (`Record`)."""
    return Template(text, _RECORD_VARIABLES, HEADER, _header)


def render_headers(
    templates: tuple[tuple[str, Template[Fields]], ...], user_properties: bool, fields: Fields
) -> list[tuple[str, str | bytes | None]] | None:
    """A kafka_out record's headers: the table's (name, template) pairs, then
    the message's user properties if the table passes them on."""
    headers: list[tuple[str, str | bytes | None]] | None = None
    if templates:
        headers = [(name, t.render(fields)) for name, t in templates]
    if user_properties and (pairs := fields.message.properties.user_property):
        headers = (headers or []) + [(k, v.encode()) for k, v in pairs]
    return headers


def envelope(fields: Fields) -> bytes:
    """The default value: the message as one JSON object. The payload is text
    when it is UTF-8 (`"payload_encoding": "utf-8"`), else base64.

    Written out by hand, byte for byte what `json.dumps(..., separators=(",",
    ":"))` of the same dict gives (tests/bridge/test_templates.py checks): a
    `json.dumps` with its own separators builds a new encoder per call, which
    cost the bridge more than the produce itself."""
    message = fields.message
    try:
        payload, encoding = _json_string(message.payload.decode()), '"utf-8"'
    except UnicodeDecodeError:
        payload = '"' + base64.b64encode(message.payload).decode() + '"'
        encoding = '"base64"'
    username = "null" if fields.username is None else _json_string(fields.username)
    pairs = message.properties.user_property
    props = ",".join(f"[{_json_string(k)},{_json_string(v)}]" for k, v in pairs) if pairs else ""
    return (
        f'{{"topic":{_json_string(message.topic)},"payload":{payload},'
        f'"payload_encoding":{encoding},"qos":{message.qos:d},'
        f'"retain":{"true" if message.retain else "false"},'
        f'"clientid":{_json_string(message.sender)},"username":{username},'
        f'"timestamp":{fields.timestamp_ms:d},"user_properties":[{props}]}}'
    ).encode()

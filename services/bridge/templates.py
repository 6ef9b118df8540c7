"""Templates of a bridge's Kafka key, value and headers.

Theory of operation. A template ("${clientid}/${topic}") is compiled once,
when the bridge is built, into a tuple of parts: literal bytes, or the name
of a variable (checked by `services.config.bridges`). Rendering a message
joins the parts' bytes: `${payload}` is the payload as it came (bytes,
never decoded), every other variable its UTF-8 text. A template that is
exactly `${payload}` hands the payload on without a copy. The default value
(no `value` in the table) is the JSON envelope, `envelope`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from services.config.bridges import TEMPLATE_VARIABLE, USER_PROPERTY
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

Part = bytes | Callable[[Fields], bytes]


class Template:
    """A compiled template; `render(fields)` gives its bytes."""

    __slots__ = ("_parts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[Part] = []
        at = 0
        for found in TEMPLATE_VARIABLE.finditer(text):
            if found.start() > at:
                parts.append(text[at : found.start()].encode())
            name = found.group(1)
            if name.startswith(USER_PROPERTY):
                parts.append(_user_property(name[len(USER_PROPERTY) :]))
            else:
                parts.append(_VARIABLES[name])  # KeyError: config let an unknown one through
            at = found.end()
        if at < len(text):
            parts.append(text[at:].encode())
        self._parts = tuple(parts)

    def render(self, fields: Fields) -> bytes:
        parts = self._parts
        if len(parts) == 1:
            part = parts[0]
            return part if isinstance(part, bytes) else part(fields)
        return b"".join(p if isinstance(p, bytes) else p(fields) for p in parts)


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

"""`Route`, the action of every message a client publishes, as a compiled class.

The other actions are `@value` records (`services.mqtt.values`): compiled code
makes one through its Python `__init__`, about 170 ns. A routed message makes
one `Route`, so this one is a native class of the compiled core, made in C
(written out here: mypyc would give a dataclass its interpreted `__init__`).
Equality, hash and repr are a record's. Pure Python (WEIR_PURE=1) it is a
plain class that behaves the same.
"""

from __future__ import annotations

from typing import Final

from services.mqtt.packets import Message


class Route:
    """Route an application message published by this client.

    When `token` is not None the node must call `channel.routed(token, ok)`
    once every durable enqueue is confirmed (ok=True) or has failed. For an
    incoming QoS 2 message, `qos2_packet_id` must be stored as awaiting
    PUBREL in the same durable step.
    """

    __match_args__: Final = ("message", "token", "qos2_packet_id")

    def __init__(
        self, message: Message, token: int | None = None, qos2_packet_id: int | None = None
    ) -> None:
        self.message: Final = message
        self.token: Final = token
        self.qos2_packet_id: Final = qos2_packet_id

    def _key(self) -> tuple[Message, int | None, int | None]:
        return self.message, self.token, self.qos2_packet_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Route):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Route(message={self.message!r}, token={self.token!r}, "
                f"qos2_packet_id={self.qos2_packet_id!r})")  # fmt: skip

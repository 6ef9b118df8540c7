"""Building blocks of the pure Channel tests (tests/mqtt/test_channel*.py).

A Channel made with fixed clocks and a fixed assigned client id, one already
connected, a CONNECT for any protocol level, and `plain()`, which blanks
Close.detail (free log text) so that whole action lists can be compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from services.mqtt.actions import Action, Close, OpenSession, Send
from services.mqtt.channel import Channel, State
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.packets import Connack, Connect, Will

NOW = 12_345.0  # the node's monotonic clock
WALL_MS = 1_763_000_000_000  # the wall clock, in ms
CFG = ChannelConfig()
ASSIGNED = "weir-assigned-1"
V3, V311, V5 = 3, 4, 5


def plain(actions: Iterable[Action]) -> list[Action]:
    return [dataclasses.replace(a, detail="") if isinstance(a, Close) else a for a in actions]


def make_connect(level: int = V5, client_id: str = "c1", **kw: Any) -> Connect:
    return Connect(
        client_id=client_id,
        protocol_level=level,
        protocol_name="MQIsdp" if level == V3 else "MQTT",
        **kw,
    )


def new_channel(cfg: ChannelConfig = CFG) -> Channel:
    return Channel(cfg, "node-1", new_client_id=lambda: ASSIGNED, wall_ms=lambda: WALL_MS)


def connected(
    level: int = V5,
    cfg: ChannelConfig = CFG,
    session_present: bool = False,
    qos2_ids: frozenset[int] = frozenset(),
    **connect_kw: Any,
) -> Channel:
    ch = new_channel(cfg)
    opened = ch.receive(make_connect(level, **connect_kw), NOW)
    assert [type(a) for a in opened] == [OpenSession]
    acts = ch.session_opened(session_present, qos2_ids)
    assert isinstance(acts[0], Send)
    assert isinstance(acts[0].packet, Connack)
    assert acts[0].packet.reason_code == 0
    assert ch.state is State.CONNECTED
    return ch


def closed(reason: str, will: Will | None = None, delay: int = 0, **kw: Any) -> Close:
    return Close(reason, will, delay, **kw)

"""What the cluster view (services.state.view) holds per client and per
retained topic, and its comparable snapshot: the values the node's parts
read from it (the directory, dumps, the API, the state store's records)."""

from __future__ import annotations

from dataclasses import dataclass

from services.state.clientsubs import SubscriptionOptions


@dataclass(frozen=True, slots=True)
class SessionEntry:
    node: str  # online: where the client is; offline: where it was last
    online: bool
    expiry_s: int  # 0: ends with the connection
    version: int
    epoch: int = 0  # of the last SessionOpened
    clean_start: bool = False
    protocol: int = 0
    username: str | None = None
    offline_since_ms: int | None = None

    @property
    def persistent(self) -> bool:
        return self.expiry_s > 0

    @property
    def expires_at_ms(self) -> int | None:
        if self.online or self.offline_since_ms is None:
            return None
        return self.offline_since_ms + self.expiry_s * 1000


@dataclass(frozen=True, slots=True)
class RetainedEntry:
    topic: str
    payload: bytes
    qos: int
    version: int
    expires_at_ms: int | None = None
    payload_format_indicator: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_property: tuple[tuple[str, str], ...] = ()
    sender: str = ""


@dataclass(frozen=True, slots=True)
class ViewSnapshot:
    """The visible state, as sorted tuples: compare two views with ==."""

    sessions: tuple[tuple[str, SessionEntry], ...]
    subscriptions: tuple[tuple[str, str, SubscriptionOptions], ...]
    retained: tuple[tuple[str, RetainedEntry], ...]

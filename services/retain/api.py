"""Retained messages: the last retained message of each topic, by filter.

The index lives in each node's memory and is fed from the `weir.retained`
event log (set / cleared), so its methods are plain and synchronous.
Implementations: `services.retain.store.MemoryRetainStore`.

Time: every method that reads takes `now_ms` (wall-clock milliseconds, the
clock of `Message.expires_at_ms`), defaulting to the current time; a
message whose `expires_at_ms <= now_ms` is gone, as if cleared.
"""

from __future__ import annotations

from typing import Protocol

from services.mqtt.packets import Message


class RetainStore(Protocol):
    def set(self, message: Message, now_ms: int | None = None) -> None:
        """Retain `message` for its topic, replacing any earlier one. An empty
        payload clears the topic (MQTT 3.3.1.3); so does a message already
        expired at `now_ms`. Raises TopicNameInvalid for a bad topic."""
        ...

    def clear(self, topic: str) -> bool:
        """Forget the topic's retained message; True if there was one."""
        ...

    def get(self, topic: str, now_ms: int | None = None) -> Message | None:
        """The unexpired retained message of exactly `topic`, if any."""
        ...

    def match(self, topic_filter: str, now_ms: int | None = None) -> list[Message]:
        """Every unexpired retained message whose topic the filter matches,
        found by walking the filter over the retained topics (cost follows
        the matching branches, not the store's size). A filter starting with
        a wildcard skips `$` topics. A `$share/...` filter matches nothing:
        retained messages go to new non-shared subscriptions only (MQTT 5
        3.3.1.3). Raises TopicFilterInvalid for a bad filter."""
        ...

    def purge_expired(self, now_ms: int | None = None) -> int:
        """Drop every message expired at `now_ms`; returns how many. A full
        scan, for a housekeeping timer; reads drop what they meet anyway."""
        ...

    def __len__(self) -> int:
        """Messages held, counting expired ones not yet dropped."""
        ...

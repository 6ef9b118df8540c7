"""Retained messages in node memory: a trie of retained topic names.

Theory of operation. Each retained topic is a path of nodes, one per level;
the node at its end holds the message. `match` walks the filter down the
trie: an exact level follows one child, `+` follows every child, `#` takes
the node it stands on (`a/#` matches `a`) and everything below it. At the
first level `+` and `#` skip children whose name starts with `$`, which is
exactly "topics starting with `$`". Expired messages met by a read are
dropped after the walk; clearing prunes every emptied node.
"""

from __future__ import annotations

import time

from services.mqtt.packets import Message
from services.mqtt.topics import parse_shared, validate_topic_filter, validate_topic_name


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _expired(message: Message, now_ms: int) -> bool:
    return message.expires_at_ms is not None and message.expires_at_ms <= now_ms


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.message: Message | None = None


class MemoryRetainStore:
    """The `services.retain.api.RetainStore` of one node's memory."""

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, message: Message, now_ms: int | None = None) -> None:
        validate_topic_name(message.topic)
        if not message.payload or _expired(message, _now_ms() if now_ms is None else now_ms):
            self.clear(message.topic)
            return
        node = self._root
        for level in message.topic.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        if node.message is None:
            self._count += 1
        node.message = message

    def clear(self, topic: str) -> bool:
        trail: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            children = node.children
            child = None if children is None else children.get(level)
            if child is None:
                return False
            trail.append((node, level))
            node = child
        if node.message is None:
            return False
        node.message = None
        self._count -= 1
        for parent, level in reversed(trail):
            if node.message is not None or node.children:
                break
            children = parent.children
            assert children is not None
            del children[level]
            if not children:
                parent.children = None
            node = parent
        return True

    def get(self, topic: str, now_ms: int | None = None) -> Message | None:
        node = self._root
        for level in topic.split("/"):
            children = node.children
            child = None if children is None else children.get(level)
            if child is None:
                return None
            node = child
        message = node.message
        if message is not None and _expired(message, _now_ms() if now_ms is None else now_ms):
            self.clear(topic)
            return None
        return message

    def match(self, topic_filter: str, now_ms: int | None = None) -> list[Message]:
        if parse_shared(topic_filter) is not None:
            return []
        validate_topic_filter(topic_filter)
        now = _now_ms() if now_ms is None else now_ms
        levels = topic_filter.split("/")
        depth_of_filter = len(levels)
        found: list[Message] = []
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == depth_of_filter:
                if node.message is not None:
                    found.append(node.message)
                continue
            level = levels[depth]
            children = node.children
            if level == "#":
                if node.message is not None:
                    found.append(node.message)
                if children is not None:
                    self._all_below(children, depth == 0, found)
            elif children is None:
                continue
            elif level == "+":
                for name, child in children.items():
                    if depth != 0 or name[:1] != "$":
                        stack.append((child, depth + 1))
            else:
                exact = children.get(level)
                if exact is not None:
                    stack.append((exact, depth + 1))
        live = [m for m in found if not _expired(m, now)]
        if len(live) != len(found):
            for message in found:
                if _expired(message, now):
                    self.clear(message.topic)
        return live

    @staticmethod
    def _all_below(children: dict[str, _Node], at_root: bool, found: list[Message]) -> None:
        stack = [c for name, c in children.items() if not (at_root and name[:1] == "$")]
        while stack:
            node = stack.pop()
            if node.message is not None:
                found.append(node.message)
            if node.children is not None:
                stack.extend(node.children.values())

    def purge_expired(self, now_ms: int | None = None) -> int:
        now = _now_ms() if now_ms is None else now_ms
        expired: list[str] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.message is not None and _expired(node.message, now):
                expired.append(node.message.topic)
            if node.children is not None:
                stack.extend(node.children.values())
        for topic in expired:
            self.clear(topic)
        return len(expired)

"""A plugin that costs only its calls: `count` no-op callbacks on message.publish
and on message.delivered (the plugin-overhead benchmark of issue 18).

    # bench-noop.toml
    [[plugin]]
    name = "bench.noop_plugin:NoopCallbacks"
    [plugin.config]
    count = 5                       # callbacks per point (default 5)

    weir up --config bench-noop.toml   # then weir bench fan-in / pairs as usual

A message.publish callback returns CONTINUE (the message unchanged, the
chain goes on); a message.delivered one returns None. With a
message.delivered callback the QoS 0 fan-out tells the hooks of every copy
(`Hooks.watches_copies`), so this measures that path too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from services.hooks.api import CONTINUE, Hooks

DEFAULT_COUNT = 5


def _publish() -> Callable[[Any, Any], Any]:
    def publish(client: Any, message: Any) -> Any:
        return CONTINUE

    return publish


def _delivered() -> Callable[[str, Any], None]:
    def delivered(client_id: str, message: Any) -> None:
        return None

    return delivered


class NoopCallbacks:
    def __init__(self, config: Mapping[str, Any]) -> None:
        count = config.get("count", DEFAULT_COUNT)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"count must be a positive integer, not {count!r}")
        # distinct function objects (a plugin's are), each one call deep
        self.publish = [_publish() for _ in range(count)]
        self.delivered = [_delivered() for _ in range(count)]

    def register(self, hooks: Hooks) -> None:
        for callback in self.publish:
            hooks.add("message.publish", callback)
        for callback in self.delivered:
            hooks.add("message.delivered", callback)
